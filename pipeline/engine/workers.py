"""The entry points of the Ray Train workers a distributed pretraining stage runs in (pipeline/engine/distributed.py
starts them): each rebuilds the stage's context from what it was sent and trains its rank with the Lightning loop, or
with the DeepSpeed CPU loop.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from pipeline.engine.dag import StageContext
from pipeline.engine.deepspeed_loop import train_with_deepspeed_cpu, use_deepspeed_cpu_accelerator
from pipeline.engine.distributed import DistributedSettings
from pipeline.engine.lightning_loop import train_with_lightning
from pipeline.engine.training import keep_freed_memory_for_reuse


def worker_context(config: dict) -> StageContext:
    """The stage context inside a Ray Train worker; the stage's W&B run stays with the stage (CSV logs here)."""
    return StageContext(OmegaConf.create(config["cfg"]), config["name"], Path(config["out_dir"]),
                        {k: Path(v) for k, v in config["inputs"].items()})


def lightning_worker(config: dict) -> None:
    import ray.train
    from ray.train.lightning import RayLightningEnvironment

    ctx, task = worker_context(config), config["task"]
    context = ray.train.get_context()
    p = task.settings(ctx.cfg)  # this worker's process begins here
    train_with_lightning(ctx, task, p, DistributedSettings.from_config(ctx.cfg, p), context.get_world_rank(),
                         context.get_world_size(), plugins=(RayLightningEnvironment(),))


def deepspeed_cpu_worker(config: dict) -> None:
    use_deepspeed_cpu_accelerator()
    keep_freed_memory_for_reuse()
    train_with_deepspeed_cpu(worker_context(config), config["task"])
