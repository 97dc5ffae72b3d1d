"""The Lightning loop of pretraining: one process, or one DDP or DeepSpeed (on GPUs) rank of a Ray Train worker. It
builds the Trainer with the harness's callbacks, resumes from the newest checkpoint (or `ckpt_path`), trains to
`max_steps`, validates the last step and writes the stage's outputs from rank 0.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Iterable

import hydra
import lightning as L
from torch.utils.data import DataLoader

from pipeline.engine.callbacks import (
    CheckpointAfterValidation,
    SparseGradientSync,
    StartingStep,
    TrainingPosition,
    ValidateAtLastStep,
)
from pipeline.engine.checkpoints import (
    CHECKPOINT_DIR,
    KEEP_CHECKPOINTS,
    STARTS_FROM_CKPT_PATH,
    AtomicCheckpointIO,
    latest_checkpoint,
)
from pipeline.engine.dag import StageContext
from pipeline.engine.distributed import (
    DEEPSPEED_DENSE,
    DistributedSettings,
    deepspeed_config,
    lightning_strategy,
    whole_parameters,
)
from pipeline.engine.divergence import DivergenceMonitor
from pipeline.engine.optim import use_dense_gradients
from pipeline.engine.pretraining_outputs import run_summary, validate_in_this_process, write_outputs
from pipeline.engine.pretraining_task import PretrainingTask, TrainingRun, built_module
from pipeline.engine.snapshots import EncoderSnapshots, encoder_snapshot_steps
from pipeline.engine.training import LossHistory, make_trainer
from pipeline.schema import PretrainConfig


def pin_batches(loader: Iterable[dict]) -> None:
    """Training on a GPU: the loader hands its batches over in page-locked memory, from which Lightning's copy to the
    device (non_blocking) runs asynchronously, overlapping the step before. Set here because the families build their
    loaders without knowing the device; a DataLoader reads the flag when each epoch's iterator starts."""
    if isinstance(loader, DataLoader):
        loader.pin_memory = True


def train_with_lightning(ctx: StageContext, task: PretrainingTask, p: PretrainConfig, settings: DistributedSettings,
                         rank: int, world_size: int, plugins: tuple = ()) -> dict:
    out = ctx.out_dir
    module = built_module(task, ctx, p)
    data = task.data(ctx, module, p, rank, world_size)
    if settings.uses_cuda:
        pin_batches(data.train_loader)
    uses_deepspeed = settings.strategy == "deepspeed"  # which writes directories and clips by itself
    if uses_deepspeed:
        use_dense_gradients(module, DEEPSPEED_DENSE)
    history, monitor = LossHistory(), DivergenceMonitor(task.settings_key(ctx.cfg), data.uniform_loss)
    # AtomicCheckpointIO keeps the newest KEEP_CHECKPOINTS files; DeepSpeed writes directories through its own
    # engine, so there Lightning prunes them, keeping the highest steps
    pruning = dict(save_top_k=KEEP_CHECKPOINTS, monitor="step", mode="max") if uses_deepspeed else dict(save_top_k=-1)
    checkpoints = CheckpointAfterValidation(dirpath=out / CHECKPOINT_DIR, filename="step-{step:06d}",
                                            auto_insert_metric_name=False,
                                            every_n_train_steps=p.checkpoint_every_steps, **pruning)
    start = StartingStep()
    configured = [hydra.utils.instantiate(c) for c in ctx.cfg.callbacks.values()]
    callbacks = [*configured, history, monitor, start, TrainingPosition(data.position), checkpoints,
                 ValidateAtLastStep()]
    if snapshots := encoder_snapshot_steps(ctx.cfg, p, task.settings_key(ctx.cfg)):
        callbacks.append(EncoderSnapshots(task, ctx, snapshots))
    if world_size > 1 and not uses_deepspeed:
        callbacks.append(SparseGradientSync(module))
    strategy = lightning_strategy(settings, deepspeed_config(settings, data.batch_size, p.grad_clip))
    trainer = make_trainer(ctx, callbacks, max_steps=p.max_steps,
                           gradient_clip_val=None if uses_deepspeed else p.grad_clip,
                           # Lightning counts val_check_interval in batches, max_steps in optimizer steps
                           val_check_interval=min(p.val_every_steps, p.max_steps) * p.accumulate_grad_batches,
                           check_val_every_n_epoch=None, num_sanity_val_steps=0, strategy=strategy,
                           plugins=[*plugins, *(() if uses_deepspeed else (AtomicCheckpointIO(KEEP_CHECKPOINTS),))],
                           use_distributed_sampler=False, accumulate_grad_batches=p.accumulate_grad_batches)
    if settings.num_workers > 1:
        from ray.train.lightning import prepare_trainer

        trainer = prepare_trainer(trainer)
    resume_from = latest_checkpoint(out)
    if resume_from is None and ctx.cfg.ckpt_path and task.settings_key(ctx.cfg) == STARTS_FROM_CKPT_PATH:
        resume_from = Path(ctx.cfg.ckpt_path).expanduser()
    if resume_from:
        print(f"resuming from {resume_from}", flush=True)
    val_loader = data.val_loader
    started = time.perf_counter()
    with warnings.catch_warnings():
        # TrainingPosition restores the data position mid-epoch where Lightning cannot see it, so Lightning's warning
        # that resuming mid-epoch "can cause unreliable results" is wrong here: the resumed losses are exactly the
        # uninterrupted run's (tests/engine/test_resume.py).
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        trainer.fit(module, data.train_loader, val_loader, ckpt_path=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - started
    if start.step is None and history.last_step("val/loss") != trainer.global_step:
        # resumed at max_steps: fit trained nothing, and the checkpoint was saved before a validation at that step
        # (one that is no multiple of the validation interval, or a checkpoint of an earlier version)
        _validate_last_step(task, ctx, p, module, settings, trainer, val_loader, history, monitor)
    resumed_from = (trainer.global_step if start.step is None else start.step) if resume_from else None
    run = TrainingRun(trainer.global_step, trainer.global_step - (resumed_from or 0), seconds, world_size,
                      p.accumulate_grad_batches, history)
    with whole_parameters(module, settings):  # every rank enters: under ZeRO-3 gathering is a collective
        summary = run_summary(task, module, data, run, resumed_from, trainer.precision)
        if trainer.is_global_zero:
            write_outputs(task, ctx, module, history, summary, settings.uses_ray_train)
    return summary


def _validate_last_step(task: PretrainingTask, ctx: StageContext, p: PretrainConfig, module: L.LightningModule,
                        settings: DistributedSettings, trainer: L.Trainer, val_loader: Iterable[dict],
                        history: LossHistory, monitor: DivergenceMonitor) -> None:
    """Validates the trained weights, gathered into a fresh module, on this rank alone, as the DeepSpeed CPU loop does.
    Not `trainer.validate`: its second strategy set-up of the module that `fit` had set up left the word embeddings on
    the CPU under DeepSpeed ZeRO-3 on a GPU (tests/engine/test_distributed.py; docs/gpu.md)."""
    with whole_parameters(module, settings):  # every rank enters: under ZeRO-3 gathering is a collective
        final = built_module(task, ctx, p)
        final.load_state_dict(module.state_dict())
    metrics = validate_in_this_process(final, val_loader, trainer.precision, trainer.strategy.root_device)
    history.record_validation(trainer.global_step, metrics)
    monitor.observe_heldout(trainer.global_step, metrics["val/loss"])
