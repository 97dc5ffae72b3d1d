"""The report stage: reads whatever result and pretraining stages the run has, and the sections its families add."""
from __future__ import annotations

from functools import partial
from itertools import chain

from omegaconf import DictConfig

from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.settings import stages_in_run
from pipeline.families import FAMILIES
from pipeline.report.report import RESULT_STAGES, write_report


def pretraining_stages() -> dict[str, tuple[str, ...]]:
    return {family.name: family.pretraining_stages for family in FAMILIES}


def report_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """The result and pretraining stages the run has, what the families' sections read, and with a pretraining stage
    the corpus it read (`prepare`'s manifest: what was kept and what was removed as overlapping the evaluation text)."""
    in_run = stages_in_run(cfg)
    pretraining = tuple(s for s in chain(*pretraining_stages().values()) if s in in_run)
    stages = pretraining + tuple(s for s in RESULT_STAGES if s in in_run)
    extra = [s for family in FAMILIES for s in family.report_upstream(cfg)]
    return tuple(dict.fromkeys((*stages, *extra, *(("prepare",) if pretraining else ()))))


def report(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    paths = write_report({name: ctx.stage_dir(name) for name in report_upstream(cfg)}, ctx.out_dir,
                         title=cfg.experiment_name, pretraining_stages=pretraining_stages(),
                         sections=tuple(partial(f.report_section, cfg) for f in FAMILIES if f.report_section),
                         wandb_run=ctx.wandb_run)
    return {k: str(v) for k, v in paths.items()}


# trainer.fast_kernels: the families' sections run their models (GPT's samples, BERT's attention heat-map) with
# models/kernels.py's modules where it is on
REPORT = Stage("report", report, report_upstream, ("experiment_name", "report", "trainer.fast_kernels"))
