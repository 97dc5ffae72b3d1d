"""Experiment tracking: W&B offline by default (never waits for network or a key), or CSV; a loss history."""
from __future__ import annotations

import csv
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf


def make_logger(cfg: DictConfig, run_dir: Path, stage_name: str):
    """One tracked run per stage, grouped by pipeline run, with the resolved config attached."""
    kind = cfg.logger.kind
    if kind == "csv":
        return CSVLogger(save_dir=str(run_dir / stage_name), name="csv_logs")
    if kind != "wandb":
        raise ValueError(f"logger.kind={kind!r} is not supported; use wandb or csv")
    os.environ["WANDB_MODE"] = cfg.logger.mode  # offline unless the user asks for online
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")
    group = f"{cfg.experiment_name}-{run_dir.name}"
    return WandbLogger(project=cfg.logger.project, group=group, name=f"{group}-{stage_name}",
                       job_type=stage_name, save_dir=str(run_dir), offline=cfg.logger.mode == "offline",
                       config=OmegaConf.to_container(cfg, resolve=True))


class LossHistory(L.Callback):
    """Every logged train loss and every validation result, for the report's loss curve."""

    def __init__(self):
        self.rows: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.rows.append({"step": trainer.global_step, "split": "train", "name": "train/loss",
                          "value": float(loss)})

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val/"):
                self.rows.append({"step": trainer.global_step, "split": "val", "name": name,
                                  "value": float(value)})

    def last(self, name: str) -> float | None:
        values = [r["value"] for r in self.rows if r["name"] == name]
        return round(values[-1], 4) if values else None

    def write_csv(self, path: Path) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["step", "split", "name", "value"])
            writer.writeheader()
            writer.writerows(self.rows)
