"""The Lightning Trainer every training stage uses, built from the `trainer` block by its `_target_` (as
lightning-hydra-template does): any Trainer argument set there reaches it (`+trainer.fast_dev_run=true`,
`limit_train_batches`, `max_time`, `profiler`), beside what the pipeline sets itself (PIPELINE_ARGUMENTS), the logger
(`logger`) and the callbacks (`callbacks`, for pretraining)."""
from __future__ import annotations

import csv
import ctypes
import ctypes.util
import functools
import inspect
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.loggers import CSVLogger
from omegaconf import MISSING, DictConfig, OmegaConf

from models.kernels import use_fast_kernels
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import check_target_arguments, typed_settings
from pipeline.engine.tracking import uses_wandb

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
Accelerator = StrEnum("Accelerator", {name: name for name in ("auto", "cpu", "gpu", "cuda")}, module=__name__)
# auto: resolve_precision's choice where the run trains; the rest are Lightning's
Precision = StrEnum("Precision", {name: name for name in ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true",
                                                          "16-true", "64-true")}, module=__name__)
# how pretraining is spread over distributed.num_workers processes (pipeline/engine/distributed.py)
Strategy = StrEnum("Strategy", {name: name for name in ("auto", "ddp", "deepspeed")}, module=__name__)


@dataclass
class TrainerConfig:
    """Schema of the `trainer` block (pipeline/config.py): the arguments conf/trainer/cpu.yaml sets, typed; the block
    is open to any other argument of its `_target_` (check_trainer_arguments)."""
    _target_: str = MISSING
    accelerator: Accelerator = MISSING
    devices: Any = MISSING  # 1 or auto: one device per training process
    strategy: Strategy = MISSING
    precision: Precision = MISSING
    log_every_n_steps: int = MISSING
    deterministic: bool = MISSING
    enable_model_summary: bool = MISSING
    compile: bool = MISSING  # the pipeline's, not a Trainer argument (PIPELINE_SETTINGS)
    # models/kernels.py's faster modules in every model the pipeline builds to train or run (with_fast_kernels): a
    # speed setting of the run, not of the model, so it is not saved with the weights. They compute what the plain
    # modules compute to float rounding (dropout draws its masks otherwise), so the stages that read it keep it in
    # their cache keys, as trainer.compile. The pipeline's, not a Trainer argument (PIPELINE_SETTINGS).
    fast_kernels: bool = True

# Keys of the `trainer` block that the pipeline reads itself and does not hand to the Trainer
PIPELINE_SETTINGS = ("compile", "fast_kernels")

# Trainer arguments the pipeline sets itself, and from what: a `trainer` block that set one would be overridden unseen,
# so it is refused at start-up (check_trainer_arguments)
PIPELINE_ARGUMENTS = {
    "max_steps": "set pretrain.max_steps", "max_epochs": "set finetune.epochs (and finetune.min_steps)",
    "accumulate_grad_batches": "set pretrain.accumulate_grad_batches", "gradient_clip_val": "set pretrain.grad_clip",
    "val_check_interval": "set pretrain.val_every_steps", "check_val_every_n_epoch": "set pretrain.val_every_steps",
    "enable_checkpointing": "set pretrain.checkpoint_every_steps", "callbacks": "pick callbacks=...",
    "logger": "pick logger=...", "enable_progress_bar": "pick callbacks=[progress_bar]",
    "default_root_dir": "each stage trains in its own directory under paths.cache_dir",
    "num_sanity_val_steps": "pretraining validates every pretrain.val_every_steps, fine-tuning after its last epoch",
    "plugins": "the pipeline's atomic checkpoint writer", "use_distributed_sampler": "the pipeline's resumable sampler",
}
# Arguments that spread one Trainer over processes: only the pretraining harness applies them; a stage that trains in
# one process (finetune) builds its Trainers without them, and its cache key leaves them out.
MULTI_PROCESS_ARGUMENTS = ("devices", "strategy")


@functools.cache  # a process-wide setting: made once, not again for every Trainer a stage builds
def keep_freed_memory_for_reuse() -> bool:
    """Make glibc keep freed memory in the process instead of handing it back to the kernel; True where applied.

    By default glibc serves every block over 32 MB (BERT's 94 MB word-embedding gradient, the MLM logits) with a
    fresh mmap and trims the heap after large frees, so each training step faults its buffers back in page by page:
    70-120k minor faults (~400 MB) per bert_base step on CPU, measured. Fixed thresholds reuse them instead (the
    reason Intel's PyTorch CPU guides preload jemalloc/tcmalloc). The cost: resident memory stays at the step's
    peak (+0.1 GB at bert_base), and freed blocks that no later request fits stay resident too: ReleaseFreedMemory
    hands those back every few steps. A no-op where the C library has no mallopt (macOS, musl).
    """
    libc = _glibc()
    return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(M_TRIM_THRESHOLD, 2_000_000_000))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (mallopt and malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel (glibc's malloc_trim(0), which also releases whole free pages
    inside the heap, not only at its top). A no-op without glibc."""
    if libc := _glibc():
        libc.malloc_trim(0)


RELEASE_EVERY_N_BATCHES = 50


class ReleaseFreedMemory(L.Callback):
    """Every `every_n_batches` training batches, release_freed_memory().

    Why: batches whose shapes change at every step (BERT's packed real tokens, sentences of any length) free blocks
    of a new size each step, and small long-lived allocations between them (oneDNN's cache of per-shape kernels)
    keep the heap from coalescing them, so the freed memory is never reused: bert_tiny's fp32 pretraining grew by
    ~4.5 MB of resident memory per step until the node ran out (docs/reliability.md). Trimming every 50 steps keeps
    it flat at no measurable cost per step (benchmarks/bench_memory.py)."""

    def __init__(self, every_n_batches: int = RELEASE_EVERY_N_BATCHES):
        self.every_n_batches = every_n_batches
        self._batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        if self._batches % self.every_n_batches == 0:
            release_freed_memory()

    def on_validation_end(self, trainer, pl_module) -> None:
        release_freed_memory()


class MemoryLog(L.Callback):
    """The process's resident memory every `every_n_steps` optimizer steps, as `sys/rss_mb` in the stage's logger
    and as rows of `memory.csv` in the stage directory (benchmarks/bench_memory.py reads it): whether training's
    memory is flat after warm-up. conf/callbacks/memory_log.yaml."""

    FILE = "memory.csv"

    def __init__(self, every_n_steps: int = 10):
        self.every_n_steps = every_n_steps

    def on_train_start(self, trainer, pl_module) -> None:
        self._path = Path(trainer.default_root_dir) / self.FILE
        if trainer.is_global_zero and not self._path.exists():
            self._path.write_text("step,rss_mb\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every_n_steps or not trainer.is_global_zero:
            return
        import psutil  # DeepSpeed's dependency, so installed wherever the pipeline is

        rss_mb = psutil.Process().memory_info().rss / 2**20
        with open(self._path, "a") as f:
            f.write(f"{step},{rss_mb:.1f}\n")
        pl_module.log("sys/rss_mb", rss_mb, on_step=True, on_epoch=False)


# Lightning's INFO lines that every Trainer logs anew ("GPU available: False, used: False", "TPU available: ...",
# "💡 Tip: ... litlogger", "`Trainer.fit` stopped: `max_epochs=1` reached", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES"),
# and seed_everything's "Seed set to 1": a fine-tune stage builds a Trainer per task, model and seed, and these would
# bury the pipeline's own lines. Lightning's warnings go through warnings.warn and still show.
LIGHTNING_BANNER_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                            "lightning.fabric.utilities.seed")


@functools.cache  # process-wide, as keep_freed_memory_for_reuse
def quiet_lightning_banners() -> None:
    for name in LIGHTNING_BANNER_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # between Lightning's and torch's versions, once per training process; nothing a user of the pipeline can change
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def make_trainer(ctx: StageContext, callbacks: list, prefix: str = "", one_process: bool = False,
                 **kwargs) -> L.Trainer:
    """The `trainer` block's Trainer with `callbacks` (and the pipeline's progress lines), the stage's logger and
    `kwargs` (the stage's own arguments: PIPELINE_ARGUMENTS, and the strategy the pretraining harness picks).
    `one_process`: without MULTI_PROCESS_ARGUMENTS, on one device."""
    keep_freed_memory_for_reuse()
    quiet_lightning_banners()
    if one_process:
        kwargs = {"devices": 1, "strategy": "auto", **kwargs}
    # _partial_: the config's arguments are instantiated (a `profiler: {_target_: ...}` too), the objects below are
    # handed over as they are
    build = hydra.utils.instantiate(trainer_arguments(ctx.cfg), _partial_=True)
    trainer = typed_settings(ctx.cfg.trainer, TrainerConfig)
    if trainer.compile:
        callbacks = [CompileNetwork(), *callbacks]
    precision = resolve_precision(str(trainer.precision))
    if not trains_on_cuda(str(trainer.accelerator)):
        warn_if_bf16_is_emulated(precision)
    return build(precision=precision, logger=make_logger(ctx, prefix),
                 callbacks=[ProgressLog(f"{ctx.name} {prefix}".strip()), ReleaseFreedMemory(), *callbacks],
                 enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
                 default_root_dir=str(ctx.out_dir), **kwargs)


def trainer_arguments(cfg: DictConfig) -> DictConfig:
    """The `trainer` block as the Trainer takes it: without PIPELINE_SETTINGS."""
    return OmegaConf.masked_copy(cfg.trainer, [key for key in cfg.trainer if key not in PIPELINE_SETTINGS])


def with_fast_kernels(model: ModuleT, cfg: DictConfig) -> ModuleT:
    """`model` (a network, or what holds one: a LightningModule, a task model) with models/kernels.py's faster
    modules swapped in where trainer.fast_kernels is on, applied from outside as torchtitan's `parallelize` applies its
    own: the one call of every place that builds a model to train or run it (pretraining's build_module, the fine-tune
    stage, the frozen encoders, decoding), right after building it and before anything compiles or wraps it."""
    if typed_settings(cfg.trainer, TrainerConfig).fast_kernels:
        use_fast_kernels(model)
    return model


def compile_network(module: L.LightningModule) -> None:
    """trainer.compile: torch.compile the network a family's LightningModule trains (its `model`, as every family's
    module holds it), in place (nn.Module.compile), so the parameters, the state-dict keys and with them the
    checkpoints and the written encoder stay as they are. Not the LightningModule: its training_step logs and checks
    in Python, which would only break the graph. Compiled on the first step, for the shapes seen then; a new batch shape
    recompiles once and is then traced with dynamic shapes."""
    module.model.compile()


class CompileNetwork(L.Callback):
    """compile_network at set-up, before the strategy moves and wraps the module (the compilation itself waits for the
    first step)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        compile_network(pl_module)


def one_process_trainer_keys(cfg: DictConfig) -> tuple[str, ...]:
    """The `trainer` settings a stage that trains in one process depends on: all but MULTI_PROCESS_ARGUMENTS."""
    return tuple(f"trainer.{key}" for key in cfg.trainer if key not in MULTI_PROCESS_ARGUMENTS)


def check_trainer_arguments(cfg: DictConfig) -> None:
    """Before any work: every key of the `trainer` block is an argument of its `_target_` that the pipeline does not
    set itself."""
    for key in cfg.trainer:
        if key in PIPELINE_ARGUMENTS:
            raise ValueError(f"trainer.{key} is the pipeline's to set ({PIPELINE_ARGUMENTS[key]}); drop "
                             f"trainer.{key}")
    check_target_arguments(trainer_arguments(cfg), "trainer")


def resolve_precision(precision: str) -> str:
    """`auto`: bf16 autocast where the CPU computes bf16 natively (AMX or AVX512-BF16), else fp32."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "bf16-mixed" if cpu_computes_bf16() else "32-true"


# oneDNN's instruction sets below AVX512_CORE_BF16 (its ONEDNN_MAX_CPU_ISA names): capped at one of these, oneDNN
# emulates bf16 whatever the CPU has
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AMX tiles or AVX512-BF16), which oneDNN's bf16 kernels need, and torch
    may use them. `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` (how docs/usage.md approximates an AVX2 laptop
    on a newer CPU) keeps the instructions from torch but not from CPUID: `auto` chose bf16 there, emulated, and
    bert_tiny's pretraining step took 3.8 s against 0.21 s in fp32 (make bench-train, batch 32 x 128)."""
    if not (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()):
        return False
    capped_isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    return (torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "AVX2")
            and capped_isa not in _ONEDNN_ISAS_WITHOUT_BF16)


def trains_on_cuda(accelerator: str) -> bool:
    """Whether trainer.accelerator puts training on a CUDA GPU (`auto`: where this machine has one)."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


@functools.cache  # once per process: a fine-tune stage builds a Trainer for every task, model kind and seed
def warn_if_bf16_is_emulated(precision: str) -> None:
    """bf16 on a CPU without bf16 instructions is emulated, converting every operand: bert_tiny trained ~12x slower
    than in fp32, without a word. Called where training runs, for the CPU it runs on, not the driver's."""
    if precision.startswith("bf16") and not cpu_computes_bf16():
        print(f"WARNING: trainer.precision={precision} on a CPU without bf16 instructions (neither AMX nor "
              "AVX512-BF16, or kept from torch by ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA): torch emulates bf16 "
              "here, many times slower than fp32; set trainer.precision=32-true, "
              "or trainer.precision=auto, which picks bf16 only where the CPU computes it", flush=True)


def make_logger(ctx, prefix: str = ""):
    """The Lightning logger of a training stage, built from the `logger` block by its `_target_`: a WandbLogger
    writing into the stage's W&B run, or e.g. CSV / TensorBoard files (tensorboardX, which Ray Tune already installs,
    writes them when `tensorboard` is absent) in the stage directory, one version per `prefix`. A Ray Train worker has
    no W&B run (the stage logs rank 0's curves into it when they finish): CSV files there."""
    if uses_wandb(ctx.cfg):
        if ctx.wandb_run is None:
            return CSVLogger(save_dir=str(ctx.out_dir), name="csv_logs", version=prefix or None)
        return hydra.utils.instantiate(ctx.cfg.logger, _partial_=True)(experiment=ctx.wandb_run, prefix=prefix,
                                                                       save_dir=str(ctx.out_dir))
    build = hydra.utils.instantiate(ctx.cfg.logger, _partial_=True)
    accepted = inspect.signature(build.func).parameters
    return build(**{k: v for k, v in (("save_dir", str(ctx.out_dir)), ("version", prefix or None)) if k in accepted})


PROGRESS_EVERY_N_STEPS = 50


class ProgressLog(L.Callback):
    """One line every `every` steps with loss, speed and ETA: readable in logs, where progress bars are not."""

    def __init__(self, label: str, every: int = PROGRESS_EVERY_N_STEPS):
        self.label, self.every = label, every
        self._started = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self._started, self._start_step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every and step != trainer.max_steps:
            return
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        print(progress_line(self.label, step, int(total), float(loss), step - self._start_step,
                            time.perf_counter() - self._started), flush=True)


def progress_line(label: str, step: int, total: int, loss: float, steps_done: int, elapsed: float) -> str:
    """The progress line both training loops print (ProgressLog; the DeepSpeed CPU loop's on_step)."""
    rate = steps_done / max(elapsed, 1e-9)
    eta = (total - step) / rate if rate > 0 else float("nan")
    return f"{label}: step {step}/{total} loss {loss:.4f} {rate:.2f} steps/s, ETA {eta:.0f} s"


class LossHistory(L.Callback):
    """Every logged train loss and every validation result, for the report's loss curve; the rows recorded before
    a checkpoint travel inside it, so the curve survives a resume."""

    def __init__(self):
        self.rows: list[dict] = []
        self._batch_lr: float | None = None
        self._batch_started: float | None = None

    def state_dict(self) -> dict:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        self.rows = list(state["rows"])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the rate this step takes: by on_train_batch_end Lightning has stepped the schedule
        self._batch_lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        rate = pl_module.rows(batch) / max(time.perf_counter() - self._batch_started, 1e-9)  # a PretrainModule's
        self.record_train(trainer.global_step, float(loss), self._batch_lr, rate)

    def record_train(self, step: int, loss: float, lr: float | None = None, rows_per_s: float | None = None) -> None:
        """A training step's loss, learning rate and rows per second (forward, backward and optimizer step; not the
        data loading), as both loops record them (the DeepSpeed CPU loop calls this itself): the curves a Ray Train
        worker's stage logs into W&B when it finishes (pipeline/engine/tracking.py log_curves)."""
        for name, value in (("train/loss", loss), ("train/lr", lr), ("train/rows_per_s", rows_per_s)):
            if value is not None:
                self.rows.append({"step": step, "split": "train", "name": name, "value": float(value)})

    def on_validation_end(self, trainer, pl_module) -> None:
        # not on_validation_epoch_end: Lightning calls the callbacks' before the module's, so what a module logs in
        # its own on_validation_epoch_end (ELMo's held-out perplexity) would be recorded one validation late
        if not trainer.sanity_checking:
            self.record_validation(trainer.global_step, trainer.callback_metrics)

    def record_validation(self, step: int, metrics: dict) -> None:
        self.rows.extend({"step": step, "split": "val", "name": name, "value": float(value)}
                         for name, value in metrics.items() if name.startswith("val/"))

    def last(self, name: str) -> float | None:
        values = [r["value"] for r in self.rows if r["name"] == name]
        return round(values[-1], 4) if values else None

    def last_step(self, name: str) -> int | None:
        steps = [r["step"] for r in self.rows if r["name"] == name]
        return steps[-1] if steps else None

    def write_csv(self, path: Path) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["step", "split", "name", "value"])
            writer.writeheader()
            writer.writerows(self.rows)
