"""Task functions of the in-process sweeps in test_sweeps.py, standing in for `python -m pipeline` (which returns the
objective). They run in Ray workers, which import this module: it imports nothing heavy, so that a worker starts in
seconds (tests.helpers imports the pipeline, torch and Lightning)."""
from __future__ import annotations

import json
import time
from pathlib import Path


def objective_and_interval(cfg, trials: int = 2, patience_s: float = 30.0) -> float:
    """A score of both swept settings, after recording when the trial ran, in the run directory Hydra gave it. A
    trial waits (up to `patience_s`) until `trials` trials have started: trials that run side by side overlap however
    long a Ray worker takes to start (seconds, for a fresh one), and trials that run one after another do not."""
    run_dir = Path(cfg.paths.run_dir)
    started = time.time()
    (run_dir.parent / f"started-{run_dir.name}").touch()
    while len(list(run_dir.parent.glob("started-*"))) < trials and time.time() < started + patience_s:
        time.sleep(0.1)
    Path(run_dir, "interval.json").write_text(json.dumps([started, time.time()]))
    return cfg.finetune.lr * 1e5 + cfg.finetune.epochs


def failed_stage(cfg) -> None:
    raise SystemExit("error: stage pretrain failed; its log: /cache/stages/pretrain/x/stage.log")


def no_finetune(cfg) -> None:
    return None  # what `python -m pipeline` returns for a run without the finetune stage
