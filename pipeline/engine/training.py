"""The Lightning Trainer every training stage uses: precision, logging, progress lines, all from config."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import lightning as L
import torch

from pipeline.engine.dag import StageContext
from pipeline.engine.tracking import ProgressLog, make_logger

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
# The trainer settings make_trainer applies: what a stage training in one process depends on. The data-parallel ones
# (trainer.strategy, num_workers, deepspeed) only the pretraining harness honours (pipeline/engine/pretraining.py), so
# only its stages may depend on the whole `trainer` block.
ONE_PROCESS_TRAINER_KEYS = ("trainer.accelerator", "trainer.devices", "trainer.precision", "trainer.log_every_n_steps",
                            "trainer.deterministic")


@functools.cache  # a process-wide setting: made once, not again for every Trainer a stage builds
def keep_freed_memory_for_reuse() -> bool:
    """Make glibc keep freed memory in the process instead of handing it back to the kernel; True where applied.

    By default glibc serves every block over 32 MB (BERT's 94 MB word-embedding gradient, the MLM logits) with a
    fresh mmap and trims the heap after large frees, so each training step faults its buffers back in page by page:
    70-120k minor faults (~400 MB) per bert_base step on CPU, measured. Fixed thresholds reuse them instead (the
    reason Intel's PyTorch CPU guides preload jemalloc/tcmalloc). The cost: resident memory stays at the step's
    peak (+0.1 GB at bert_base). A no-op where the C library has no mallopt (macOS, musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(M_TRIM_THRESHOLD, 2_000_000_000))


def make_trainer(ctx: StageContext, callbacks: list, prefix: str = "", **kwargs) -> L.Trainer:
    keep_freed_memory_for_reuse()
    tcfg = ctx.cfg.trainer
    return L.Trainer(accelerator=tcfg.accelerator, devices=tcfg.devices,
                     precision=resolve_precision(str(tcfg.precision)),
                     logger=make_logger(ctx, prefix),
                     callbacks=[ProgressLog(f"{ctx.name} {prefix}".strip()), *callbacks],
                     log_every_n_steps=tcfg.log_every_n_steps, deterministic=tcfg.deterministic,
                     default_root_dir=str(ctx.out_dir), enable_model_summary=False, enable_progress_bar=False,
                     **kwargs)


def log_step_outputs(module: L.LightningModule, split: str, out: dict, batch_size: int) -> None:
    """Every value of a model_step's output as `<split>/<name>`: per step in training, per epoch otherwise; the
    loss also on the progress bar."""
    on_step = split == "train"
    module.log_dict({f"{split}/{k}": v.detach() for k, v in out.items() if k != "loss"}, on_step=on_step,
                    on_epoch=not on_step, batch_size=batch_size)
    module.log(f"{split}/loss", out["loss"].detach(), prog_bar=True, on_step=on_step, on_epoch=not on_step,
               batch_size=batch_size)


def resolve_precision(precision: str) -> str:
    """`auto`: bf16 autocast where the CPU computes bf16 natively (AMX or AVX512-BF16), else fp32."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    return "bf16-mixed" if native else "32-true"
