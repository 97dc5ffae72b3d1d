"""Task functions of the in-process sweeps in test_sweeps.py, standing in for `python -m pipeline` (which returns the
objective). They run in Ray workers, which import this module: it imports nothing heavy, so that a worker starts in
seconds (tests.helpers imports the pipeline, torch and Lightning)."""
from __future__ import annotations

import json
import time
from pathlib import Path


def objective_and_interval(cfg) -> float:
    """A score of both swept settings, after recording when the trial ran, in the run directory Hydra gave it."""
    started = time.time()
    time.sleep(1)
    Path(cfg.paths.run_dir, "interval.json").write_text(json.dumps([started, time.time()]))
    return cfg.finetune.lr * 1e5 + cfg.finetune.epochs


def failed_stage(cfg) -> None:
    raise SystemExit("error: stage pretrain failed; its log: /cache/stages/pretrain/x/stage.log")


def no_finetune(cfg) -> None:
    return None  # what `python -m pipeline` returns for a run without the finetune stage
