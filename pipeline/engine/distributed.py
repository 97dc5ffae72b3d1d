"""Data parallelism applied from the outside, by config: the models in models/ never know how they are trained.

`trainer.strategy` (auto | ddp | deepspeed) and `distributed.num_workers` pick the path:
- one process (`trainer=cpu`, or `trainer=gpu` on a machine with one GPU): plain Lightning, nothing from here;
- `num_workers > 1`: Ray Train starts the worker processes (`TorchTrainer`, one device each) and Lightning trains
  in each with `RayDDPStrategy` or `RayDeepSpeedStrategy`. Ray Train, not Lightning's own launchers, because a
  stage already runs inside a Ray task: Lightning's DDP launcher re-executes `sys.argv` (a Ray worker's, there),
  while Ray Train places the processes, sets up the gloo/NCCL process group, and scales out to a cluster unchanged;
- DeepSpeed without CUDA: Lightning's DeepSpeedStrategy refuses a CPU accelerator, so each Ray Train worker drives
  `deepspeed.initialize` itself (pipeline/engine/deepspeed_loop.py), over gloo, with DeepSpeed's CPU accelerator.

The `distributed` block holds what no Trainer argument says here: `num_workers` and the ZeRO settings (`deepspeed`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

import torch
from omegaconf import MISSING, DictConfig, OmegaConf
from torch import nn

from pipeline.engine.settings import RayConfig, all_cpus, typed_settings
from pipeline.engine.training import TrainerConfig, resolve_precision, trains_on_cuda, warn_if_bf16_is_emulated
from pipeline.schema import PretrainConfig

ZERO_STAGES = (1, 2, 3)
# DeepSpeed's ZeRO stages leave sparse gradients out of their reduction buckets (split_half_float_double in
# deepspeed/runtime/zero/stage_1_and_2.py; its `sparse_gradients` option is for training without ZeRO), so each rank
# would step with its own
DEEPSPEED_DENSE = "DeepSpeed's ZeRO cannot reduce sparse ones"
# The `trainer` settings of the schema (conf/trainer/cpu.yaml's), which the DeepSpeed CPU loop (no Lightning Trainer)
# reads or has no use for; a Trainer argument beyond them would be ignored there, so it is refused
DEEPSPEED_CPU_TRAINER_KEYS = tuple(f.name for f in fields(TrainerConfig))
# trainer=gpu: one Ray Train worker per GPU of the machine the config is resolved on (the driver's: stage hashes and
# validation resolve it there, so the cache key holds the number of workers that trained)
OmegaConf.register_new_resolver("cuda_device_count", torch.cuda.device_count, replace=True)


@dataclass
class DeepSpeedConfig:
    """ZeRO's settings. A block, never null: OmegaConf 2.3 cannot merge an override into a null typed block
    (`distributed.deepspeed={stage: 3, ...}` raised AttributeError), so `stage` is null where there is no ZeRO."""
    stage: Optional[int] = MISSING
    offload_optimizer: bool = MISSING
    offload_parameters: bool = MISSING


@dataclass
class DistributedConfig:
    """Schema of the `distributed` block (pipeline/config.py)."""
    num_workers: int = MISSING
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)  # used by trainer.strategy=deepspeed alone


@dataclass(frozen=True)
class DistributedSettings:
    strategy: str
    num_workers: int
    accelerator: str
    devices: object
    precision: str
    zero_stage: int | None
    offload_optimizer: bool
    offload_parameters: bool
    accumulate_grad_batches: int

    @classmethod
    def from_config(cls, cfg: DictConfig, training: PretrainConfig | None = None) -> "DistributedSettings":
        """`training`: the settings of the pretraining run being set up (a phase's); by default the `pretrain` block."""
        t, d = typed_settings(cfg.trainer, TrainerConfig), typed_settings(cfg.distributed, DistributedConfig)
        training = training or typed_settings(cfg.pretrain, PretrainConfig)
        return cls(strategy=str(t.strategy), num_workers=d.num_workers, accelerator=str(t.accelerator),
                   devices=t.devices, precision=str(t.precision), zero_stage=d.deepspeed.stage,
                   offload_optimizer=d.deepspeed.offload_optimizer, offload_parameters=d.deepspeed.offload_parameters,
                   accumulate_grad_batches=training.accumulate_grad_batches)

    @property
    def uses_cuda(self) -> bool:
        return trains_on_cuda(self.accelerator)

    @property
    def deepspeed_on_cpu(self) -> bool:
        return self.strategy == "deepspeed" and not self.uses_cuda

    @property
    def uses_ray_train(self) -> bool:
        return self.num_workers > 1 or self.deepspeed_on_cpu


def validate_distributed(cfg: DictConfig) -> None:
    """Impossible trainer settings fail here, before any work starts, with the config to use instead."""
    s = DistributedSettings.from_config(cfg)
    if s.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.accelerator={s.accelerator}, and this machine has no CUDA GPU; use trainer=cpu, or "
                         "trainer=ddp_cpu for data parallelism on the CPU")
    if s.precision == "16-mixed" and not s.uses_cuda:  # Lightning swaps it for bf16-mixed on the CPU
        raise ValueError("trainer.precision=16-mixed: fp16 autocast needs a CUDA GPU, and on the CPU Lightning trains "
                         "in bf16-mixed in its place; set trainer.precision=bf16-mixed, 32-true or auto")
    if s.num_workers < 1:
        raise ValueError(f"distributed.num_workers={s.num_workers}; use 1 (one process) or more (Ray Train workers)")
    if (s.zero_stage is not None or s.offload_optimizer or s.offload_parameters) and s.strategy != "deepspeed":
        raise ValueError(f"distributed.deepspeed (ZeRO stage {s.zero_stage}, offload_optimizer={s.offload_optimizer}, "
                         f"offload_parameters={s.offload_parameters}) needs trainer.strategy=deepspeed, not "
                         f"{s.strategy!r}; pick trainer=deepspeed (distributed.deepspeed.stage=1|2|3) instead of "
                         "adding ZeRO settings to another trainer")
    if s.strategy == "deepspeed":
        if s.zero_stage not in ZERO_STAGES:
            raise ValueError(f"distributed.deepspeed.stage={s.zero_stage}; use one of {ZERO_STAGES}")
        if s.offload_parameters and s.zero_stage != 3:
            raise ValueError(f"distributed.deepspeed.offload_parameters needs ZeRO stage 3 (got stage {s.zero_stage}):"
                             " only stage 3 partitions the parameters; set distributed.deepspeed.stage=3")
        if s.offload_optimizer and s.zero_stage == 1:
            raise ValueError("distributed.deepspeed.offload_optimizer needs ZeRO stage 2 or 3; "
                             "set distributed.deepspeed.stage=2 or 3")
        if s.precision.startswith("16") and not s.uses_cuda:
            raise ValueError(f"trainer.precision={s.precision}: DeepSpeed on the CPU trains in fp32 or bf16; "
                             "use trainer.precision=32-true or bf16-mixed")
    if s.deepspeed_on_cpu:
        _check_deepspeed_cpu(cfg)
    if s.strategy == "ddp" and s.num_workers < 2 and not s.uses_cuda:  # one GPU (trainer=gpu): one process
        raise ValueError("trainer.strategy=ddp needs distributed.num_workers >= 2 (one Ray Train worker per process); "
                         "use trainer=ddp_cpu, or trainer=cpu for one process")
    if str(s.devices) not in ("1", "auto"):
        raise ValueError(f"trainer.devices={s.devices}: each training process drives one device; for more, set "
                         "distributed.num_workers (Ray Train workers, one device each) and trainer.devices=auto, or "
                         "use trainer=gpu for every GPU of the machine")
    ray = typed_settings(cfg.ray, RayConfig)
    if s.uses_ray_train and not s.uses_cuda and not ray.address and s.num_workers > ray.num_cpus:
        # Ray Train would wait forever for the CPUs of the workers it cannot place
        raise ValueError(f"distributed.num_workers={s.num_workers} Ray Train workers need a CPU each, and this run's "
                         f"Ray has ray.num_cpus={ray.num_cpus}; raise ray.num_cpus or lower distributed.num_workers")


def _check_deepspeed_cpu(cfg: DictConfig) -> None:
    """DeepSpeed on the CPU trains with deepspeed.initialize, without a Lightning Trainer: what only a Trainer applies
    would be ignored there."""
    instead = "train on GPUs, or with trainer=ddp_cpu, or drop it"
    extra = [key for key in cfg.trainer if key not in DEEPSPEED_CPU_TRAINER_KEYS]
    if extra:
        raise ValueError(f"trainer.{extra[0]}: DeepSpeed on the CPU trains without a Lightning Trainer, so Trainer "
                         f"arguments beyond conf/trainer/cpu.yaml's do not apply; {instead}")
    if cfg.callbacks:
        raise ValueError(f"callbacks.{next(iter(cfg.callbacks))}: DeepSpeed on the CPU trains without a Lightning "
                         f"Trainer, which runs callbacks; {instead} (callbacks=none)")
    if cfg.ckpt_path:
        raise ValueError(f"ckpt_path={cfg.ckpt_path}: DeepSpeed on the CPU resumes from its own ZeRO checkpoints, "
                         f"not a Lightning checkpoint; {instead}")


def stage_cpus(cfg: DictConfig) -> float:
    """CPUs the stage's own Ray task reserves: none when Ray Train workers take them, or they would wait forever."""
    return 0.0 if DistributedSettings.from_config(cfg).uses_ray_train else all_cpus(cfg)


def deepspeed_config(s: DistributedSettings, micro_batch_size: int, grad_clip: float) -> dict:
    """The DeepSpeed JSON, generated from the trainer and pretrain configs, in the process that trains: its precision
    is resolved there (`auto`: bf16 where the device computes it natively), as Lightning resolves the Trainer's, so
    the JSON and the run summary agree."""
    precision = resolve_precision(s.precision)
    if not s.uses_cuda:
        warn_if_bf16_is_emulated(precision)
    zero: dict = {"stage": s.zero_stage}
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if s.offload_parameters:
        zero["offload_param"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": s.accumulate_grad_batches,
            "gradient_clipping": grad_clip,
            "zero_optimization": zero,
            "bf16": {"enabled": precision.startswith("bf16")},
            "fp16": {"enabled": precision.startswith("16")},
            # the optimizer is the pipeline's own AdamW (no decay on biases/LayerNorm, linear schedule), and
            # torch's implementation needs no JIT-compiled DeepSpeed op, offloaded or not
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 1 << 30}


def lightning_strategy(s: DistributedSettings, ds_config: dict):
    """The Lightning strategy for a run in this process (one device) or in a Ray Train worker."""
    # Lightning writes gradient_accumulation_steps from the Trainer's accumulate_grad_batches and refuses a JSON that
    # already has it (found on the first GPU run: every Lightning DeepSpeed run failed at setup); the DeepSpeed CPU
    # loop, which has no Trainer, reads it from the JSON
    lightning_config = {key: value for key, value in ds_config.items() if key != "gradient_accumulation_steps"}
    if s.num_workers > 1:
        from ray.train.lightning import RayDDPStrategy, RayDeepSpeedStrategy

        if s.strategy == "deepspeed":
            return RayDeepSpeedStrategy(config=lightning_config)
        return RayDDPStrategy(process_group_backend="nccl" if s.uses_cuda else "gloo")
    if s.strategy == "deepspeed":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(config=lightning_config)
    return "auto"


@contextmanager
def whole_parameters(module: nn.Module, s: DistributedSettings):
    """Inside: every parameter of `module` whole on every rank. ZeRO-3 leaves each rank its shard alone (the tensors
    Lightning's DeepSpeedStrategy hands back are empty), so an encoder written from them would be empty too; the
    DeepSpeed CPU loop consolidates from its checkpoint instead (consolidated_state_dict)."""
    if s.strategy != "deepspeed" or s.zero_stage != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        yield


def run_on_ray_workers(train_fn: Callable[[dict], None], config: dict, s: DistributedSettings,
                       storage_dir: Path) -> None:
    """Run `train_fn(config)` in `s.num_workers` Ray Train workers (one CPU or GPU each) and wait for them."""
    from ray.train import RunConfig, ScalingConfig, WorkerGroupError
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(train_fn, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=s.num_workers, use_gpu=s.uses_cuda),
                           run_config=RunConfig(storage_path=str(storage_dir), name="ray_train"))
    try:
        trainer.fit()
    except WorkerGroupError as err:
        # the lowest rank's own error, whose message says what to change, rather than Ray's digest of every rank's
        # traceback (which stays in the log, chained)
        ranks = sorted(err.worker_failures)
        if not ranks:
            raise
        failure = err.worker_failures[ranks[0]]
        raise getattr(failure, "_base_exc", failure) from err  # Ray wraps it to carry the worker's traceback


def gather_from_ranks(local: dict) -> list[dict]:
    """Every rank's `local`, in rank order ([local] in one process): for checkpoints, which rank 0 alone writes, of
    what differs between ranks (each one's data position, carried state, RNG). Every rank must call it."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [local]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


def this_ranks_state(ranks: list[dict]) -> dict:
    """This rank's entry of a checkpoint's `gather_from_ranks` list."""
    import torch.distributed as dist

    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if len(ranks) != world_size:
        raise ValueError(f"the checkpoint was written by {len(ranks)} training process(es), this run has "
                         f"{world_size}; resume with distributed.num_workers={len(ranks)}, or start the stage over "
                         "with pipeline.force")
    return ranks[rank]
