"""Entry point of a pipeline run: validate the config, start (or join) Ray, execute the stage DAG."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from data_prep.corpus.prepare import manifest_summary
from pipeline.config import Config, PipelineConfig, check_declared_keys
from pipeline.data_settings import DataConfig
from pipeline.downstream.finetune import (
    FINETUNE,
    MODEL_KINDS,
    check_controls,
    check_task_files,
    finetune_seeds,
    finetune_settings,
    headline_results,
    task_names,
    train_sizes,
)
from pipeline.downstream.tasks import load_task
from pipeline.engine.checkpoints import check_start_checkpoint
from pipeline.engine.dag import StageFailed, plan, resolve_upstream, run_dag, select_stages
from pipeline.engine.distributed import validate_distributed
from pipeline.engine.pretraining import check_model_config
from pipeline.engine.settings import (
    PathsConfig,
    RayConfig,
    cache_dir_of,
    check_ranges,
    check_target_arguments,
    did_you_mean,
    model_key,
    typed_settings,
)
from pipeline.engine.snapshots import encoder_snapshot_steps
from pipeline.engine.tracking import check_logger, uses_wandb
from pipeline.engine.training import check_trainer_arguments
from pipeline.families import FAMILIES
from pipeline.schema import PretrainConfig
from pipeline.stages import STAGES
from pipeline.status import PIPELINE_FILE


def validate(cfg: DictConfig) -> list[str]:
    """Fail before any work starts, with a message the user can act on. Types and names (stages, optimizers, model
    kinds) are the schema's, checked at composition (pipeline/config.py); here: keys no schema declares, numeric
    ranges, files, and rules across settings. Returns the stages the run executes, in order."""
    check_declared_keys(cfg)
    check_ranges(cfg, Config)  # every block's numbers, in the ranges their schema's fields declare (`ranged`)
    data, run = typed_settings(cfg.data, DataConfig), typed_settings(cfg.pipeline, PipelineConfig)
    if data.corpus_dir and not Path(data.corpus_dir).expanduser().is_dir():
        raise FileNotFoundError(f"data.corpus_dir={data.corpus_dir} is not a directory; point it at a "
                                "directory of .txt books, or leave it null for the built-in corpus")
    cache_dir = Path(cache_dir_of(cfg)).expanduser()
    if cache_dir.exists() and not cache_dir.is_dir():
        raise NotADirectoryError(f"paths.cache_dir={cache_dir} is a file, not a directory; set paths.cache_dir to a "
                                 "directory (one that does not exist yet is made)")
    check_trainer_arguments(cfg)
    check_logger(cfg)
    for name, callback in cfg.callbacks.items():
        check_target_arguments(callback, f"callbacks.{name}")
    check_start_checkpoint(cfg)
    for key in dict.fromkeys(model_key(cfg, family.name) for family in FAMILIES):  # gpt.model beside BERT's
        check_model_config(cfg, key)
    finetune = finetune_settings(cfg)
    for name in task_names(finetune.task):
        load_task(name)
    train_sizes(finetune)
    finetune_seeds(finetune)
    validate_distributed(cfg)
    # every family's; BERT's phase 2 in its own validate
    encoder_snapshot_steps(cfg, typed_settings(cfg.pretrain, PretrainConfig), "pretrain")
    stages = resolve_upstream(STAGES, cfg)
    in_run = select_stages(stages, run.stages, run.until)
    warn_of_an_until_outside_the_run(run, stages, in_run)
    for family in FAMILIES:
        family.validate(cfg, in_run)
    if FINETUNE.name in in_run:
        check_task_files(cfg)  # read now, not after pretraining
        check_controls(cfg)
    return in_run


def absolute_paths(cfg: DictConfig) -> None:
    """paths.cache_dir and paths.run_dir as absolute paths: a relative cache directory made relative links from the run
    directory, which dangled, so every stage succeeded and then the run failed, `pipeline.status` saying 'not run';
    stages in Ray workers need not share the driver's working directory either."""
    for key in ("cache_dir", "run_dir"):
        cfg.paths[key] = str(Path(cfg.paths[key]).expanduser().absolute())


def warn_of_an_until_outside_the_run(run: PipelineConfig, stages: dict, in_run: list[str]) -> None:
    """pipeline.until names a stage this run's stages do not include (another family's: `bert_pretrain` is BERT's, and
    `+experiment=gpt_tiny pipeline.until=bert_pretrain` ran without a word what the two share, the corpus): say so."""
    until = run.until
    run_stages = select_stages(stages, run.stages, None)
    if not until or until in run_stages:
        return
    hint = did_you_mean(str(until), run_stages, "pipeline.until=")
    print(f"WARNING: pipeline.until={until} is not one of this run's stages ({', '.join(run_stages)}); the run "
          f"stops at what it shares with {until}: {', '.join(in_run) or 'nothing'}. {hint}", flush=True)


def clear_an_earlier_run(run_dir: Path, in_run: list[str]) -> None:
    """Remove the stage links and pipeline.json that an earlier run left in `run_dir` (hydra.run.dir given again):
    a rerun with other settings into a finished run's directory printed that run's results.md as its own, and kept
    links to stages it never ran. run_dag links each of this run's stages once it is reused or finishes, so rerunning
    the same command to resume ends with the directory it had; the stages this run does not have are named."""
    if not run_dir.is_dir():
        return
    links = [path for path in run_dir.iterdir() if path.is_symlink() and path.name in STAGES]
    for link in links:
        link.unlink()
    (run_dir / PIPELINE_FILE).unlink(missing_ok=True)
    outside = [link.name for link in links if link.name not in in_run]
    if outside:
        print(f"note: hydra.run.dir={run_dir} held an earlier run's stages that this run does not have "
              f"({', '.join(outside)}); their links were removed, so that the directory shows this run alone",
              flush=True)


def init_ray(settings: RayConfig) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = settings.address
    if ray.is_initialized():  # a Ray this process joined before (a notebook, a sweep's driver) is kept
        connected = ray.get_runtime_context().gcs_address
        if address and address != "auto" and address != connected:
            print(f"note: ray.address={address} is not used: this process is already connected to the Ray "
                  f"cluster at {connected}, and the run uses it; call ray.shutdown() first to join {address}",
                  flush=True)
        return
    if address:  # "auto" or "ray://host:port": join an existing cluster, which owns its resources
        ray.init(address=address, log_to_driver=True)
    else:
        start_local_ray(settings.num_cpus)


def start_local_ray(num_cpus: int, log_to_driver: bool = True) -> None:
    """A Ray of this machine alone, of `num_cpus` CPUs, whose workers run at the driver's priority. The tests' session
    Ray starts here too (with log_to_driver=False), so that it is the Ray a run starts."""
    import ray

    # Ray's raylet starts workers at nice 15 (its worker_niceness) to keep a node's daemons responsive; here the
    # stages are the job and run in those workers, so any process at the default priority took the cores from
    # them (pretraining fell from 5.4 to ~1 step/s beside one such process on 2 cores). Ray's job manager starts
    # job workers at 0 for the same reason (ray/dashboard/modules/job/job_manager.py).
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver)


def finetune_objective(run_dir: Path) -> float | None:
    """The pretrained encoders' fine-tuning dev score (the kinds with a random-init twin: `bert`, `gpt`, ...),
    averaged over the tasks (each on its main metric, the first one the task reports): what a sweep over finetune.*
    maximises (conf/sweep/). None when the run has no finetune."""
    results = run_dir / "finetune" / "results.json"
    if not results.is_file():
        return None
    rows = [r for r in headline_results(json.loads(results.read_text()))
            if r["model"] in MODEL_KINDS and MODEL_KINDS[r["model"]].random_twin]
    main_metric = {}
    for row in rows:
        main_metric.setdefault(row["task"], row["metric"])
    scores = [r["score"] for r in rows if r["metric"] == main_metric[r["task"]]]
    return float(np.mean(scores)) if scores else None


INTERRUPTED = "interrupted; rerun the same command to resume"


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_pipeline(cfg: DictConfig) -> Path:
    """Validate, run, print where the results are. SIGINT (Ctrl-C) and SIGTERM end a run alike: the stages' Ray tasks
    are cancelled and Ray is shut down, one line says how to resume, and the exit code is 130, where a user used to
    get a KeyboardInterrupt traceback (and exit code 1 during Ray's start-up).

    A run started where Ray is already up (a sweep's trial, a Ray task of the sweeper's: hydra_plugins/) leaves Ray and
    the process's signals to whoever started them: shutting Ray down there would disconnect the sweeper's worker."""
    import ray

    in_run = validate(cfg)
    absolute_paths(cfg)
    paths = typed_settings(cfg.paths, PathsConfig)
    run_dir = Path(paths.run_dir)
    Path(paths.cache_dir).mkdir(parents=True, exist_ok=True)
    if typed_settings(cfg.pipeline, PipelineConfig).dry_run:
        print(plan(cfg, STAGES).describe())
        return run_dir
    clear_an_earlier_run(run_dir, in_run)
    if uses_wandb(cfg):
        os.environ["WANDB_MODE"] = cfg.logger.get("mode", "offline")  # inherited by Ray workers
    owns_ray = not ray.is_initialized()
    handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)} if owns_ray else {}
    interrupted = False
    try:
        init_ray(typed_settings(cfg.ray, RayConfig))
        if owns_ray:
            signal.signal(signal.SIGTERM, _interrupt)  # ray.init installs its own, which exits on the spot
        results = run_dag(cfg, STAGES, run_dir)
    except StageFailed as err:
        raise SystemExit(f"error: {err}") from None
    except KeyboardInterrupt:
        interrupted = True
        for sig in handlers:  # a second Ctrl-C must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
    finally:
        if owns_ray:
            ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if interrupted:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        raise SystemExit(130)
    report = run_dir / "report" / "results.md"
    if report.is_file():
        print(f"\nresults: {report}\n{report.read_text()}")
    if "prepare" in results:  # the stage's own summary is printed in a Ray worker, whose last output Ray often drops
        print(manifest_summary(run_dir / "prepare"))
    print(f"run directory: {run_dir}")
    return run_dir
