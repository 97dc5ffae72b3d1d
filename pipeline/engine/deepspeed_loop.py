"""The DeepSpeed CPU loop of pretraining: Lightning's DeepSpeedStrategy refuses a CPU accelerator, so each Ray Train
worker drives `deepspeed.initialize` itself (`train_deepspeed`), over gloo, with DeepSpeed's CPU accelerator, and
checkpoints, resumes, logs and stops on a non-finite loss as the Lightning loop does; rank 0 then consolidates the ZeRO
partitions of the last checkpoint into one module, validates it and writes the stage's outputs
(`train_with_deepspeed_cpu`).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from pipeline.engine.checkpoints import CHECKPOINT_DIR, KEEP_CHECKPOINTS, step_of
from pipeline.engine.dag import StageContext
from pipeline.engine.distributed import (
    DEEPSPEED_DENSE,
    DistributedSettings,
    deepspeed_config,
    gather_from_ranks,
    this_ranks_state,
)
from pipeline.engine.divergence import DivergenceMonitor, reduce_mean
from pipeline.engine.module import PretrainModule, check_finite_loss, pretraining_advice
from pipeline.engine.optim import use_dense_gradients
from pipeline.engine.pretraining_outputs import run_summary, validate_in_this_process, write_outputs
from pipeline.engine.pretraining_task import PretrainingTask, TrainingRun, built_module
from pipeline.engine.settings import typed_settings
from pipeline.engine.training import (
    PROGRESS_EVERY_N_STEPS,
    RELEASE_EVERY_N_BATCHES,
    LossHistory,
    TrainerConfig,
    compile_network,
    progress_line,
    release_freed_memory,
    resolve_precision,
)

CHECKPOINT_TAG_PREFIX = "step-"


def use_deepspeed_cpu_accelerator() -> None:
    """Before deepspeed is first imported: its CPU accelerator, and a persistent cache for any JIT-built op."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                          str(Path.home() / ".cache" / "textrep" / "torch_extensions"))


def checkpoint_tags(checkpoint_dir: Path) -> list[str]:
    """Complete DeepSpeed checkpoints in `checkpoint_dir`, oldest first."""
    tags = [p.name for p in checkpoint_dir.glob(f"{CHECKPOINT_TAG_PREFIX}*") if (p / "complete").is_file()]
    return sorted(tags, key=lambda tag: int(tag.removeprefix(CHECKPOINT_TAG_PREFIX)))


def set_sampler_epoch(loader, epoch: int) -> None:
    """What Lightning does before each epoch: tell the loader's sampler which epoch's order to draw."""
    set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def train_deepspeed(module: nn.Module, optimizer: torch.optim.Optimizer, scheduler, ds_config: dict,
                    loader: Iterable[dict], max_steps: int, checkpoint_dir: Path, checkpoint_every_steps: int,
                    keep_checkpoints: int, rank_state: Callable[[int], dict], load_rank_state: Callable[[dict], None],
                    advice: str, on_step: Callable[[int, float, float, float], None] = lambda *step: None):
    """Train `module` (whose forward returns {"loss": ...}) with a DeepSpeed engine; returns the engine. A loss that
    is not finite stops it, saying `advice` (pipeline/engine/module.py's check, as in the Lightning loop). After each
    optimizer step, `on_step(step, loss, lr, rows_per_s)`: the mean loss of its micro-batches, the rate it took, and
    the rows it trained per second of forward, backward and step (what the Lightning loop logs).

    A pass over `loader` is an epoch (its sampler's `set_epoch` is called before each, as Lightning does); an endless
    loader is one long epoch. Besides DeepSpeed's own state every checkpoint holds, per rank, `rank_state(n)` (`n`:
    batches consumed this epoch) and the torch RNG; a run resumes from the newest complete checkpoint in
    `checkpoint_dir`, handing each rank its own state (`load_rank_state`). Keeps the newest `keep_checkpoints`."""
    import deepspeed
    import torch.distributed as dist

    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config)
    epoch = consumed = 0
    if tags := checkpoint_tags(checkpoint_dir):
        _, client_state = engine.load_checkpoint(str(checkpoint_dir), tag=tags[-1])
        epoch, consumed = client_state["epoch"], client_state["batches_consumed"]
        own = this_ranks_state(client_state["ranks"])
        load_rank_state(own["state"])
        torch.set_rng_state(own["rng"])
        print(f"resumed from DeepSpeed checkpoint {checkpoint_dir / tags[-1]}", flush=True)
    micro_losses, rows, busy = [], 0, 0.0
    while engine.global_steps < max_steps:
        set_sampler_epoch(loader, epoch)
        for batch in loader:
            started = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]  # before engine.step(), which steps the schedule too
            loss = engine(batch)["loss"]
            check_finite_loss(loss, engine.global_steps,
                              f"{advice} (the last good checkpoint is kept in {checkpoint_dir})")
            engine.backward(loss)
            step_before = engine.global_steps
            engine.step()  # an optimizer step only at the last micro-batch of gradient accumulation
            consumed += 1
            micro_losses.append(float(loss.detach()))
            rows, busy = rows + PretrainModule.rows(batch), busy + time.perf_counter() - started
            if engine.global_steps == step_before:
                continue
            step = engine.global_steps
            on_step(step, sum(micro_losses) / len(micro_losses), lr, rows / max(busy, 1e-9))
            micro_losses, rows, busy = [], 0, 0.0
            if step % checkpoint_every_steps == 0 or step == max_steps:
                ranks = gather_from_ranks({"state": rank_state(consumed), "rng": torch.get_rng_state()})
                _save_checkpoint(engine, checkpoint_dir, step, keep_checkpoints,
                                 {"epoch": epoch, "batches_consumed": consumed, "ranks": ranks})
            if step >= max_steps:
                break
        else:
            epoch, consumed = epoch + 1, 0
    dist.barrier()
    return engine


def _save_checkpoint(engine, checkpoint_dir: Path, step: int, keep: int, client_state: dict) -> None:
    import torch.distributed as dist

    tag = f"{CHECKPOINT_TAG_PREFIX}{step}"
    engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state=client_state)
    dist.barrier()  # every rank's shard is written before the checkpoint counts as complete
    if dist.get_rank() == 0:
        (checkpoint_dir / tag / "complete").touch()
        for old in checkpoint_tags(checkpoint_dir)[:-keep]:
            shutil.rmtree(checkpoint_dir / old)


def consolidated_state_dict(checkpoint_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """One fp32 state dict from a ZeRO checkpoint's partitions (any stage), loadable without DeepSpeed."""
    use_deepspeed_cpu_accelerator()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag)


def train_with_deepspeed_cpu(ctx: StageContext, task: PretrainingTask) -> None:
    """One rank of the DeepSpeed CPU loop, in a Ray Train worker (pipeline/engine/workers.py)."""
    import torch.distributed as dist

    out, p = ctx.out_dir, task.settings(ctx.cfg)  # this worker's process begins here
    settings = DistributedSettings.from_config(ctx.cfg, p)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    module = built_module(task, ctx, p)
    use_dense_gradients(module, DEEPSPEED_DENSE)
    if typed_settings(ctx.cfg.trainer, TrainerConfig).compile:  # no Trainer here to run CompileNetwork
        compile_network(module)
    data = task.data(ctx, module, p, rank, world_size)
    optimization = module.configure_optimizers()
    history, monitor = LossHistory(), DivergenceMonitor(task.settings_key(ctx.cfg), data.uniform_loss)
    checkpoint_dir = out / CHECKPOINT_DIR

    def on_step(step: int, loss: float, lr: float, rows_per_s: float) -> None:
        history.record_train(step, loss, lr, rows_per_s)
        monitor.observe_train(step, reduce_mean(loss))
        if rank == 0 and (step % PROGRESS_EVERY_N_STEPS == 0 or step == p.max_steps):
            print(progress_line(ctx.name, step, p.max_steps, loss, step - first_step,
                                time.perf_counter() - started), flush=True)
        if step % RELEASE_EVERY_N_BATCHES == 0:  # as every Lightning Trainer does (ReleaseFreedMemory)
            release_freed_memory()

    def rank_state(consumed: int) -> dict:
        return {"data": data.position.state_dict(consumed), "history": history.state_dict(),
                "monitor": monitor.state_dict()}

    def load_rank_state(state: dict) -> None:
        data.position.load_state_dict(state["data"])
        history.load_state_dict(state["history"])
        monitor.load_state_dict(state["monitor"])

    resumed_from = checkpoint_tags(checkpoint_dir)
    first_step = step_of(resumed_from[-1]) if resumed_from else 0
    started = time.perf_counter()
    train_deepspeed(module, optimization["optimizer"], optimization["lr_scheduler"]["scheduler"],
                    deepspeed_config(settings, data.batch_size, p.grad_clip), data.train_loader, p.max_steps,
                    checkpoint_dir, p.checkpoint_every_steps, KEEP_CHECKPOINTS, rank_state, load_rank_state,
                    pretraining_advice(task.settings_key(ctx.cfg)), on_step)
    seconds = time.perf_counter() - started
    if rank != 0:
        return
    tag = checkpoint_tags(checkpoint_dir)[-1]
    # the fp32 weights of every partition, in a fresh module: what the encoder is written from, and validated
    final = built_module(task, ctx, p)
    final.load_state_dict(consolidated_state_dict(checkpoint_dir, tag))
    metrics = validate_in_this_process(final, data.val_loader, resolve_precision(settings.precision))
    history.record_validation(p.max_steps, metrics)
    monitor.observe_heldout(p.max_steps, metrics["val/loss"])
    resumed_step = step_of(resumed_from[-1]) if resumed_from else None
    run = TrainingRun(p.max_steps, p.max_steps - (resumed_step or 0), seconds, world_size,
                      p.accumulate_grad_batches, history)
    summary = {**run_summary(task, final, data, run, resumed_step, resolve_precision(settings.precision)),
               "zero_stage": settings.zero_stage, "consolidated_from": str(checkpoint_dir / tag)}
    write_outputs(task, ctx, final, history, summary, in_ray_worker=True)
