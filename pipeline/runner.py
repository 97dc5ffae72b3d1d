"""Entry point of a pipeline run: validate the config, start (or join) Ray, execute the stage DAG."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from data_prep.prepare import manifest_summary
from pipeline.downstream.finetune import headline_results, task_names, train_sizes
from pipeline.downstream.tasks import load_task
from pipeline.engine.dag import StageFailed, plan, resolve_upstream, run_dag
from pipeline.engine.distributed import validate_distributed
from pipeline.engine.tracking import LOGGER_KINDS
from pipeline.families import FAMILIES
from pipeline.stages import STAGES


def validate(cfg: DictConfig) -> None:
    """Fail before any work starts, with a message the user can act on."""
    plan_check = cfg.pipeline
    unknown = [s for s in [*plan_check.stages, *(plan_check.force or [])] if s not in STAGES]
    if plan_check.until and plan_check.until not in STAGES:
        unknown.append(plan_check.until)
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; valid stages, in order: {list(STAGES)}")
    if cfg.data.corpus_dir and not Path(cfg.data.corpus_dir).expanduser().is_dir():
        raise FileNotFoundError(f"data.corpus_dir={cfg.data.corpus_dir} is not a directory; point it at a "
                                "directory of .txt books, or leave it null for the built-in corpus")
    if cfg.data.input_format not in ("raw", "sentence_per_line"):
        raise ValueError(f"data.input_format={cfg.data.input_format!r}; use raw or sentence_per_line")
    if cfg.logger.kind not in LOGGER_KINDS:
        raise ValueError(f"logger.kind={cfg.logger.kind!r}; use one of {LOGGER_KINDS} (logger=wandb|csv)")
    for name in task_names(cfg):
        load_task(name)
    train_sizes(cfg)
    validate_distributed(cfg)
    for family in FAMILIES:
        family.validate(cfg)
    resolve_upstream(STAGES, cfg)  # e.g. an unknown evaluate.encoders name


def init_ray(cfg: DictConfig) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    if cfg.ray.address:  # "auto" or "ray://host:port": join an existing cluster, which owns its resources
        ray.init(address=cfg.ray.address, log_to_driver=True)
    else:
        ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, log_to_driver=True)


def finetune_objective(run_dir: Path) -> float | None:
    """The pretrained encoder's fine-tuning dev score, averaged over the tasks (each on its main metric, the first
    one the task reports): what a sweep over finetune.* maximises (conf/sweep/). None when the run has no finetune."""
    results = run_dir / "finetune" / "results.json"
    if not results.is_file():
        return None
    rows = [r for r in headline_results(json.loads(results.read_text())) if r["model"] == "pretrained"]
    main_metric = {}
    for row in rows:
        main_metric.setdefault(row["task"], row["metric"])
    scores = [r["score"] for r in rows if r["metric"] == main_metric[r["task"]]]
    return float(np.mean(scores)) if scores else None


def run_pipeline(cfg: DictConfig) -> Path:
    import ray

    validate(cfg)
    run_dir = Path(cfg.paths.run_dir)
    Path(cfg.paths.cache_dir).mkdir(parents=True, exist_ok=True)
    if cfg.pipeline.dry_run:
        print(plan(cfg, STAGES).describe())
        return run_dir
    os.environ["WANDB_MODE"] = cfg.logger.get("mode", "offline")  # inherited by Ray workers
    init_ray(cfg)
    try:
        results = run_dag(cfg, STAGES, run_dir)
    except StageFailed as err:
        raise SystemExit(f"error: {err}") from None
    finally:
        ray.shutdown()
    report = run_dir / "report" / "results.md"
    if report.is_file():
        print(f"\nresults: {report}\n{report.read_text()}")
    if "prepare" in results:  # the stage's own summary is printed in a Ray worker, whose last output Ray often drops
        print(manifest_summary(run_dir / "prepare"))
    print(f"run directory: {run_dir}")
    return run_dir
