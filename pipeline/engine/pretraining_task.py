"""The contract between the pretraining harness and a family: what a family supplies (`PretrainingTask`: its module,
its data, what it writes and sums up), what its data hook hands the harness (`PretrainingData`, with the
`DataPosition` every checkpoint saves), what the harness tells its summary once training is over (`TrainingRun`), and
`built_module`, the one place every module the harness trains or validates is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

from omegaconf import DictConfig

from pipeline.engine.dag import StageContext
from pipeline.engine.module import PretrainModule
from pipeline.engine.training import LossHistory, with_fast_kernels
from pipeline.schema import PretrainConfig


class DataPosition(Protocol):
    """Where a rank's training data stands, saved in every checkpoint (SeededBatchSampler is one)."""

    def state_dict(self, batches_consumed: int) -> dict: ...  # after `batches_consumed` batches of this epoch

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class PretrainingData:
    """One rank's data. A pass over `train_loader` is an epoch; its sampler's `set_epoch` is called before each."""
    train_loader: Iterable[dict]
    position: DataPosition
    val_loader: Iterable[dict]  # held-out batches (a DataLoader), the same on every rank
    batch_size: int             # rows of one rank's batch
    uniform_loss: float         # held-out loss of a uniform guess over the model's outputs (engine/divergence.py)


@dataclass
class TrainingRun:
    """What the harness knows once training is over, for a family's summary."""
    steps: int
    steps_run: int  # in this process, after any resume
    seconds: float
    world_size: int
    accumulate_grad_batches: int
    history: LossHistory

    @property
    def batches_per_s(self) -> float:
        """Batches of all ranks together per second of this process's training."""
        return self.steps_run * self.accumulate_grad_batches * self.world_size / max(self.seconds, 1e-9)

    def rows_seen(self, batch_size: int) -> int:
        """The training rows (instances, blocks, windows, triples) of all steps, every rank's every micro-batch of
        `batch_size` rows: what a model card counts its tokens from."""
        return self.steps * self.accumulate_grad_batches * self.world_size * batch_size


class PretrainingTask(Protocol):
    """What a family supplies: its module (a PretrainModule, pipeline/engine/module.py: the family's loss, the engine's
    optimizer, checks and logging, whichever loop trains it), its data, and what it writes and sums up."""
    def settings_key(self, cfg: DictConfig) -> str: ...  # the config block of the settings below, named in messages

    # max_steps, grad_clip, val_every_steps, ...: the schema's typed object (typed_settings, merged_settings)
    def settings(self, cfg: DictConfig) -> PretrainConfig: ...

    # The hooks below get `settings`, what `settings` above gave once where the stage (or a Ray Train worker) began.
    # seeded: the same weights on every rank; built with OptimizerSettings.of(settings, settings_key)
    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> PretrainModule: ...

    def data(self, ctx: StageContext, module: PretrainModule, settings: PretrainConfig, rank: int,
             world_size: int) -> PretrainingData: ...

    def write(self, ctx: StageContext, module: PretrainModule) -> None: ...  # what later stages read, in out_dir

    def summary(self, module: PretrainModule, data: PretrainingData, run: TrainingRun) -> dict: ...


def built_module(task: PretrainingTask, ctx: StageContext, p: PretrainConfig) -> PretrainModule:
    """The family's module (task.build_module), with the run's kernels (trainer.fast_kernels) applied from outside:
    every module the harness trains or validates is built here, whichever family."""
    return with_fast_kernels(task.build_module(ctx, p), ctx.cfg)
