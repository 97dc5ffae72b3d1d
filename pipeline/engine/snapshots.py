"""Encoder snapshots: what a pretraining stage writes at the end, also written into
`<out_dir>/encoder_snapshots/step-<N>/` as training passes each step N of `<settings>.encoder_snapshots`
(`EncoderSnapshots`), and how a later stage finds them and the steps the final encoder took: the encoders a fine-tune
stage compares to show what more pretraining buys downstream.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from pipeline.engine.dag import MARKER, StageContext
from pipeline.engine.distributed import DistributedSettings
from pipeline.engine.pretraining_task import PretrainingTask
from pipeline.schema import PretrainConfig

SNAPSHOT_DIR = "encoder_snapshots"


def encoder_snapshot_steps(cfg: DictConfig, settings: PretrainConfig, key: str) -> list[int]:
    """`<key>.encoder_snapshots` (a list of whole numbers: the schema's), in order: each a step the run takes,
    refused before any work otherwise."""
    steps = list(settings.encoder_snapshots)
    bad = [s for s in steps if not 0 < s <= settings.max_steps]
    if bad:
        raise ValueError(f"{key}.encoder_snapshots={steps}: {bad} not a step of the run; each must be a whole number "
                         f"from 1 to {key}.max_steps={settings.max_steps}")
    if steps and DistributedSettings.from_config(cfg, settings).strategy == "deepspeed":
        raise ValueError(f"{key}.encoder_snapshots={steps}: under DeepSpeed the encoder is written once, from the "
                         "ZeRO partitions of the last checkpoint; pretrain with trainer=cpu or trainer=ddp_cpu to "
                         f"keep snapshots, or set {key}.encoder_snapshots=[]")
    return sorted(set(steps))


def snapshot_dir(stage_dir: Path, step: int) -> Path:
    return stage_dir / SNAPSHOT_DIR / f"step-{step}"


def encoder_snapshots(stage_dir: Path) -> dict[int, Path]:
    """step -> directory of each snapshot a pretraining stage wrote (laid out as the stage's own output), in order."""
    found = {int(p.name.removeprefix("step-")): p for p in (stage_dir / SNAPSHOT_DIR).glob("step-*")}
    return dict(sorted(found.items()))


def steps_trained(stage_dir: Path) -> int:
    """The steps a finished pretraining stage took: what its own output (the final encoder) has seen."""
    return int(json.loads((stage_dir / MARKER).read_text())["steps"])


class EncoderSnapshots(L.Callback):
    """Writes what the stage writes at the end (the task's `write`) into encoder_snapshots/step-<N>/ when training
    reaches step N, before that step's checkpoint (Lightning runs ModelCheckpoint last): a run resumed from a
    checkpoint already has the snapshots up to it, and writes the later ones from the weights an uninterrupted run
    has at those steps."""

    def __init__(self, task: PretrainingTask, ctx: StageContext, steps: list[int]):
        self.task, self.ctx, self.steps = task, ctx, set(steps)

    def on_train_start(self, trainer, pl_module) -> None:
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # with gradient accumulation the micro-batches after a step end here with the same global_step
        if step != self._last_step and step in self.steps and trainer.is_global_zero:
            self.write(pl_module, step)
        self._last_step = step

    def write(self, module: L.LightningModule, step: int) -> None:
        final = snapshot_dir(self.ctx.out_dir, step)
        staging = final.with_name(f".{final.name}.tmp")  # a kill mid-write leaves no snapshot, not half of one
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self.task.write(replace(self.ctx, out_dir=staging), module)
        shutil.rmtree(final, ignore_errors=True)  # a killed run's, of the same weights: it had no checkpoint since
        os.replace(staging, final)
