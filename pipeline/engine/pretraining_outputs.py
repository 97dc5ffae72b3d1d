"""What both training loops do once training is over: validate the final weights in this process alone, sum the run
up, and write the family's outputs and the loss curve, and, in a Ray Train worker, the summary the stage hands on.
"""
from __future__ import annotations

from typing import Iterable

import lightning as L
import torch

from data_prep.corpus.shards import write_json_atomically
from pipeline.engine.dag import StageContext
from pipeline.engine.pretraining_task import PretrainingData, PretrainingTask, TrainingRun
from pipeline.engine.training import LossHistory

LOSS_CURVE = "loss_curve.csv"
WORKER_SUMMARY = "train_summary.json"  # how rank 0 of the Ray Train workers hands the stage its summary


def validate_in_this_process(module: L.LightningModule, val_loader: Iterable[dict], precision: str,
                             device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """The module's own validation, in this process alone, on `device`: what it logs under `val/`."""
    accelerator, devices = ("gpu", [device.index or 0]) if device.type == "cuda" else ("cpu", 1)
    trainer = L.Trainer(accelerator=accelerator, devices=devices, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, val_loader, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}


def run_summary(task: PretrainingTask, module: L.LightningModule, data: PretrainingData, run: TrainingRun,
                resumed_from: int | None, precision: str) -> dict:
    return {"steps": run.steps, "resumed_from_step": resumed_from, "workers": run.world_size,
            "seconds": round(run.seconds, 1), "precision": precision,
            "final_val_loss": run.history.last("val/loss"),
            "uniform_val_loss": round(data.uniform_loss, 4),  # a uniform guess's: the loss that means nothing learned
            "num_parameters": sum(t.numel() for t in module.parameters()), **task.summary(module, data, run)}


def write_outputs(task: PretrainingTask, ctx: StageContext, module: L.LightningModule, history: LossHistory,
                  summary: dict, in_ray_worker: bool) -> None:
    task.write(ctx, module)
    history.write_csv(ctx.out_dir / LOSS_CURVE)
    if in_ray_worker:
        write_json_atomically(ctx.out_dir / WORKER_SUMMARY, summary)
