"""Task functions of the in-process sweeps in test_sweeps.py, standing in for `python -m pipeline` (which returns the
objective). They run in Ray workers, which import this module: it imports nothing heavy, so that a worker starts in
seconds (tests.helpers imports the pipeline, torch and Lightning)."""
from __future__ import annotations


def objective(cfg) -> float:
    """A score of both swept settings."""
    return cfg.finetune.lr * 1e5 + cfg.finetune.epochs


def failed_stage(cfg) -> None:
    raise SystemExit("error: stage pretrain failed; its log: /cache/stages/pretrain/x/stage.log")


def no_finetune(cfg) -> None:
    return None  # what `python -m pipeline` returns for a run without the finetune stage
