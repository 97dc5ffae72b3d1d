"""Experiment tracking: one W&B run per executed stage, grouped by pipeline run, offline by default (never waits
for a network or an API key); stage outputs logged as artifacts and consumed with `use_artifact` for lineage.

Every stage's Ray worker runs this, the data stages' too, so it does not import Lightning (and with it torch, ~400 MB
per worker) unless the logger block needs it; the training stages' loggers are in engine/training.py."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.engine.settings import check_target_arguments

LINEAGE_FILE = "wandb_lineage.jsonl"  # offline runs' artifact inputs, one JSON line per stage run
# wandb.init arguments the pipeline sets for every stage's run; the logger block may not
STAGE_RUN_ARGUMENTS = ("group", "job_type", "name", "tags", "dir", "config", "reinit", "settings")
LIGHTNING_LOGGERS = "lightning.pytorch.loggers."
# WandbLogger's own parameters: the logger block's other keys go on to wandb.init. Listed here, not read off the class,
# so that a stage's worker need not import Lightning to start its W&B run; test_tracking checks the list against it.
WANDB_LOGGER_PARAMETERS = frozenset({"name", "save_dir", "version", "offline", "dir", "id", "anonymous", "project",
                                     "log_model", "experiment", "prefix", "checkpoint_name", "add_file_policy",
                                     "kwargs"})


def uses_wandb(cfg: DictConfig) -> bool:
    """Whether the `logger` block is W&B's (Lightning's WandbLogger or a subclass): then every stage gets a W&B run."""
    target = cfg.logger._target_
    if target.startswith(LIGHTNING_LOGGERS):  # told by name, without importing Lightning
        return target.rsplit(".", 1)[1] == "WandbLogger"
    from lightning.pytorch.loggers import WandbLogger

    return issubclass(hydra.utils.get_class(target), WandbLogger)


def wandb_init_arguments(logger: DictConfig) -> dict:
    """The `logger` block's wandb.init arguments: `project` and those WandbLogger passes on to wandb.init (`mode`,
    `entity`, ...); its own (`log_model`, `prefix`, ...) apply to the WandbLogger of a training stage."""
    own = WANDB_LOGGER_PARAMETERS - {"project"}
    return {k: v for k, v in OmegaConf.to_container(logger, resolve=True).items() if k != "_target_" and k not in own}


def check_logger(cfg: DictConfig) -> None:
    """Before any work: every key of the `logger` block is an argument of its `_target_` (of wandb.init, for what
    WandbLogger passes on) that the pipeline does not set itself."""
    if not uses_wandb(cfg):
        check_target_arguments(cfg.logger, "logger")
        return
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    for key in wandb_init_arguments(cfg.logger):
        if key in STAGE_RUN_ARGUMENTS:
            raise ValueError(f"logger.{key} is set by the pipeline for each stage's W&B run "
                             f"({', '.join(STAGE_RUN_ARGUMENTS)}); drop logger.{key}")
    check_target_arguments(cfg.logger, "logger", [WandbLogger, wandb.init])


def _artifact(name: str, digest: str, out_dir: Path):
    """One artifact per stage name; each configuration's output is a version of it, aliased by its config hash
    (`pretrain:<hash>`), so W&B lists a stage's outputs together and diffs them."""
    import wandb

    artifact = wandb.Artifact(name, type=name, metadata={"stage": name, "hash": digest})
    # A reference, not a copy: shards and checkpoints stay where the cache keeps them.
    artifact.add_reference(f"file://{out_dir}", checksum=False)
    return artifact


def start_stage_run(cfg: DictConfig, name: str, digest: str, run_dir: Path | None,
                    inputs: dict[str, tuple[Path, str]]):
    """A W&B run for one stage execution (None unless the logger is W&B's)."""
    if not uses_wandb(cfg):
        return None
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")
    group = f"{cfg.experiment_name}-{Path(run_dir).name if run_dir else 'run'}"
    upstream = {up: f"{up}:{up_digest}" for up, (_, up_digest) in inputs.items()}
    model = OmegaConf.select(cfg, "model.config.name")
    init = wandb_init_arguments(cfg.logger)
    run = wandb.init(**init, group=group, job_type=name, name=f"{group}-{name}",
                     tags=[cfg.experiment_name, name, *([model] if model else [])],
                     dir=str(run_dir) if run_dir else None,
                     config={**OmegaConf.to_container(cfg, resolve=True), "stage": name, "stage_hash": digest,
                             "upstream_artifacts": upstream},
                     reinit="create_new", settings=wandb.Settings(init_timeout=120, silent=True))
    if init.get("mode") == "online":
        for up, (up_dir, up_digest) in inputs.items():
            run.use_artifact(_artifact(up, up_digest, up_dir), aliases=[up_digest])
    elif run_dir is not None:
        # W&B refuses use_artifact offline: the edges are kept here and replayed by `python -m pipeline.sync`.
        with open(Path(run_dir) / LINEAGE_FILE, "a") as f:
            f.write(json.dumps({"run_id": run.id, "stage": name, "uses": sorted(upstream.values())}) + "\n")
    return run


def finish_stage_run(run, name: str, digest: str, out_dir: Path, ok: bool, summary: dict | None = None) -> None:
    if run is None:
        return
    if ok:
        run.summary.update({k: v for k, v in (summary or {}).items() if isinstance(v, (int, float, str))})
        run.log_artifact(_artifact(name, digest, out_dir), aliases=[digest])
    run.finish(exit_code=0 if ok else 1)
    # Stages run in Ray workers, which Ray ends when it trims its pool of idle workers; W&B's own atexit teardown of
    # the service process it started in this worker then finds the service gone and prints a ConnectionResetError
    # traceback into the run's output. Tear it down here instead; the next stage in this worker starts a new one.
    import wandb

    wandb.teardown()


def log_curves(run, loss_curve: Path) -> int:
    """Log a training run's curves (a LossHistory CSV: step, split, name, value) into the W&B run `run`, one
    `log` per step in step order; returns the number of steps logged. Ray Train workers train in processes of
    their own that cannot write to the stage's W&B run (an offline run has one writer), so the stage logs rank 0's
    curves once the workers finish."""
    if run is None or not loss_curve.is_file():
        return 0
    by_step: dict[int, dict[str, float]] = {}
    with open(loss_curve, newline="") as f:
        for row in csv.DictReader(f):
            by_step.setdefault(int(row["step"]), {})[row["name"]] = float(row["value"])
    for step in sorted(by_step):
        run.log(by_step[step], step=step)
    return len(by_step)
