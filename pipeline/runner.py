"""Runs the configured stages in order inside one run directory, with Ray started once for the data stages."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from omegaconf import DictConfig

from pipeline.stages import STAGES, RunContext
from pipeline.tasks import load_task


def validate(cfg: DictConfig) -> None:
    """Fail before any work starts, with a message the user can act on."""
    unknown = [s for s in cfg.pipeline.stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown} in pipeline.stages; valid stages, in order: {list(STAGES)}")
    if cfg.data.corpus_dir and not Path(cfg.data.corpus_dir).expanduser().is_dir():
        raise FileNotFoundError(f"data.corpus_dir={cfg.data.corpus_dir} is not a directory; point it at a "
                                "directory of .txt books, or leave it null for the built-in corpus")
    if cfg.data.input_format not in ("raw", "sentence_per_line"):
        raise ValueError(f"data.input_format={cfg.data.input_format!r}; use raw or sentence_per_line")
    if "finetune" in cfg.pipeline.stages:
        load_task(cfg.finetune.task)


def _init_ray(cfg: DictConfig) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, include_dashboard=False, log_to_driver=True)
    else:
        ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, log_to_driver=True)


def run_stage(ctx: RunContext, name: str) -> dict:
    """Run one stage into `<run_dir>/<name>/` and record its summary (duration, counts) in stage.json."""
    out = ctx.stage_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    print(f"stage {name}: running → {out}", flush=True)
    started = time.perf_counter()
    summary = {"stage": name, **STAGES[name](ctx)}
    summary["duration_s"] = round(time.perf_counter() - started, 1)
    (out / "stage.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"stage {name}: done in {summary['duration_s']} s", flush=True)
    return summary


def run_pipeline(cfg: DictConfig) -> Path:
    import ray

    validate(cfg)
    run_dir = Path(cfg.paths.run_dir)
    Path(cfg.paths.cache_dir).mkdir(parents=True, exist_ok=True)
    _init_ray(cfg)
    try:
        for name in cfg.pipeline.stages:
            run_stage(RunContext(cfg, run_dir), name)
    finally:
        ray.shutdown()
    report = run_dir / "report" / "results.md"
    if report.is_file():
        print(f"\nresults: {report}\n{report.read_text()}")
    print(f"run directory: {run_dir}")
    return run_dir
