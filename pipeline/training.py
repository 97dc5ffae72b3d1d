"""The Lightning Trainer every training stage uses: precision, logging, progress lines, all from config."""
from __future__ import annotations

import lightning as L

from pipeline.dag import StageContext
from pipeline.lit import resolve_precision
from pipeline.tracking import ProgressLog, make_logger


def make_trainer(ctx: StageContext, callbacks: list, prefix: str = "", **kwargs) -> L.Trainer:
    tcfg = ctx.cfg.trainer
    return L.Trainer(accelerator=tcfg.accelerator, devices=tcfg.devices,
                     precision=resolve_precision(str(tcfg.precision)),
                     logger=make_logger(ctx, prefix),
                     callbacks=[ProgressLog(f"{ctx.name} {prefix}".strip()), *callbacks],
                     log_every_n_steps=tcfg.log_every_n_steps, deterministic=tcfg.deterministic,
                     default_root_dir=str(ctx.out_dir), enable_model_summary=False, enable_progress_bar=False,
                     **kwargs)
