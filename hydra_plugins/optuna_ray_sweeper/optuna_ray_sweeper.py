"""Hydra sweeper `optuna_ray`: Optuna (current, >= 3) chooses each trial's settings, Ray runs the trials, as many at a
time as the Ray cluster's CPUs hold. A sweep config (conf/sweep/) selects it, and it runs as any Hydra sweep:

    python -m pipeline -m +experiment=bert_tiny +sweep=finetune_lr_epochs

Why not the alternatives: hydra-optuna-sweeper (1.3.0, the newest) requires optuna < 3, whose metadata stops at
Python 3.9, and SQLAlchemy 1.4; hydra-ray-launcher requires ray < 3 and cloudpickle < 3. Ray Tune's OptunaSearch
would add a second experiment directory, trial numbering and result files beside Hydra's, for what Tune is for (early
stopping on intermediate results, population-based training) a trial here has nothing: it reports one number when it
ends, the fine-tuning score. So Optuna asks and is told directly, and each trial is one Hydra job (its own
multirun/<…>/<n>/ directory and .hydra/ files, as Hydra's basic launcher makes them) run as a Ray task; `hydra.launcher`
is not used. Trials of one sweep share paths.cache_dir, so the stages their settings do not change run once.
"""
# No `from __future__ import annotations`: Hydra's plugin scanner runs this module before it is in sys.modules, where
# dataclasses look string annotations up.
import itertools
import logging
import math
import random
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"  # hydra-optuna-sweeper's name and keys (best_params, best_value)


class Direction(Enum):
    minimize = "minimize"
    maximize = "maximize"


class Sampler(Enum):
    tpe = "tpe"        # Optuna's TPE (Bergstra et al. 2011): Bayesian, needs n_trials
    random = "random"  # needs n_trials
    grid = "grid"      # every combination of the choice params, in a seeded random order; n_trials: null = all


class Kind(Enum):
    choice = "choice"          # values: [...]
    uniform = "uniform"        # low, high
    loguniform = "loguniform"  # low > 0, high
    int = "int"                # low, high: whole numbers, both included


@dataclass
class Param:
    kind: Kind = MISSING
    values: Optional[List[Any]] = None
    low: Optional[float] = None
    high: Optional[float] = None


@dataclass
class OptunaRaySweeperConf:
    _target_: str = "hydra_plugins.optuna_ray_sweeper.optuna_ray_sweeper.OptunaRaySweeper"
    direction: Direction = Direction.maximize
    sampler: Sampler = Sampler.tpe
    n_trials: Optional[int] = None
    # Fixed, so that rerunning a sweep (one that was interrupted) asks for the same trials, which the stage cache then
    # answers without training; exactly so for grid and random, and for TPE when trials run one at a time (in
    # parallel, what TPE asks next also depends on which trial finished first).
    seed: int = 0
    params: Dict[str, Param] = field(default_factory=dict)  # config key -> its search space


ConfigStore.instance().store(group="hydra/sweeper", name="optuna_ray", node=OptunaRaySweeperConf, provider="textrep")


def search_space(params: dict[str, Param]) -> dict:
    """Optuna distributions of hydra.sweeper.params, or a ValueError naming the entry and what it needs."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for key, param in params.items():
        where = f"hydra.sweeper.params[{key}]"
        if param.kind is Kind.choice:
            values = param.values or []
            if not values or param.low is not None or param.high is not None:
                raise ValueError(f"{where}: kind choice takes `values: [...]` (one or more) and no low/high")
            odd = [v for v in values if not (v is None or isinstance(v, (bool, int, float, str)))]
            if odd:
                raise ValueError(f"{where}: choice values must be numbers, strings, booleans or null, not {odd}")
            space[key] = CategoricalDistribution(values)
            continue
        low, high = param.low, param.high
        if param.values is not None or low is None or high is None or not low < high:
            raise ValueError(f"{where}: kind {param.kind.value} takes `low` < `high` and no values; "
                             f"got low={low}, high={high}, values={param.values}")
        if param.kind is Kind.loguniform and low <= 0:
            raise ValueError(f"{where}: kind loguniform needs low > 0; got low={low}")
        if param.kind is Kind.int:
            if low != int(low) or high != int(high):
                raise ValueError(f"{where}: kind int takes whole numbers; got low={low}, high={high}")
            space[key] = IntDistribution(int(low), int(high))
        else:
            space[key] = FloatDistribution(low, high, log=param.kind is Kind.loguniform)
    return space


def override(key: str, value: Any) -> str:
    return f"{key}={'null' if value is None else value}"


def _run_trial(hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig, singleton_state) -> Any:
    """One trial, in a Ray worker: the Hydra job of `config` (composed by the sweeper), as Hydra's own launchers run a
    job in another process. Returns the task function's value: `python -m pipeline` returns the objective."""
    setup_globals()
    Singleton.set_state(singleton_state)
    try:
        job = run_job(hydra_context=hydra_context, task_function=task_function, config=config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except SystemExit as exit_:  # the pipeline ends a failed run with its message; Ray would lose it with the worker
        raise TrialFailed(str(exit_.code)) from None
    return job.return_value  # raises what the task raised


class TrialFailed(RuntimeError):
    pass


class OptunaRaySweeper(Sweeper):
    def __init__(self, direction: Direction, sampler: Sampler, n_trials: int | None, seed: int,
                 params: DictConfig) -> None:
        params = OmegaConf.to_object(params)  # Param instances: a DictConfig's .values is dict.values
        if not params:
            raise ValueError("hydra.sweeper.params is empty: give each swept key a search space, e.g. "
                             "finetune.lr: {kind: loguniform, low: 1e-5, high: 1e-3} (conf/sweep/ has examples)")
        self.space = search_space(params)
        self.direction, self.sampler, self.seed = direction, sampler, seed
        if sampler is Sampler.grid:
            not_choices = [k for k, p in params.items() if p.kind is not Kind.choice]
            if not_choices:
                raise ValueError(f"hydra.sweeper.sampler=grid walks choices only; {not_choices} are not: "
                                 "make them kind choice, or use sampler=tpe with n_trials")
            size = math.prod(len(d.choices) for d in self.space.values())
            if n_trials is not None and not 1 <= n_trials <= size:
                raise ValueError(f"hydra.sweeper.n_trials={n_trials}: the grid has {size} points; "
                                 f"use 1 to {size}, or null for all of them")
            n_trials = size if n_trials is None else n_trials
        elif n_trials is None or n_trials < 1:
            raise ValueError(f"hydra.sweeper.n_trials={n_trials}: sampler={sampler.value} needs a number of trials")
        self.n_trials = n_trials

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def _study(self):
        import optuna

        # TPE's constant_liar (on by default in Optuna 5) counts running trials as poor results, so that trials
        # asked for meanwhile spread out instead of repeating the running ones
        sampler = (optuna.samplers.TPESampler(seed=self.seed) if self.sampler is Sampler.tpe
                   else optuna.samplers.RandomSampler(seed=self.seed))
        study = optuna.create_study(direction=self.direction.value, sampler=sampler)
        if self.sampler is Sampler.grid:  # enqueued trials take these values, the sampler is not asked
            grid = [dict(zip(self.space, values))
                    for values in itertools.product(*(d.choices for d in self.space.values()))]
            random.Random(self.seed).shuffle(grid)
            for point in grid[:self.n_trials]:
                study.enqueue_trial(point)
        return study

    def _trial_config(self, fixed: list[str], number: int, params: dict) -> DictConfig:
        overrides = [*fixed, *(override(k, v) for k, v in params.items())]
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = number
            # Resolved here, once: on another node, a trial's driver would otherwise read its own environment
            # (TEXTREP_CACHE_DIR, HOME) and miss the cache the other trials fill.
            config.paths.cache_dir = self.cache_dir
        self.run_dirs[number] = str(Path(config.hydra.sweep.dir) / str(config.hydra.sweep.subdir))
        log.info(f"\t#{number} : {' '.join(overrides[len(fixed):])}")
        return config

    def _concurrency(self) -> int:
        """As many trials as the cluster holds at once: each trial's training stages reserve ray.num_cpus CPUs
        (pipeline/engine/settings.py all_cpus), so a local Ray of ray.num_cpus CPUs runs one trial at a time."""
        import ray

        cpus = ray.cluster_resources().get("CPU", 0)
        return max(1, int(cpus // self.config.ray.num_cpus))

    def sweep(self, arguments: list[str]) -> None:
        import ray

        from pipeline.engine.settings import RayConfig, typed_settings
        from pipeline.runner import init_ray

        swept = [o.input_line for o in OverridesParser.create().parse_overrides(arguments) if o.is_sweep_override()]
        if swept:
            raise SystemExit(f"error: {swept}: the optuna_ray sweeper searches hydra.sweeper.params, not values listed "
                             "on the command line; add each key there, e.g. "
                             "finetune.lr: {kind: choice, values: [1e-4, 3e-4]}")
        with read_write(self.config.hydra.sweep):  # trials may start in another working directory (a cluster node)
            self.config.hydra.sweep.dir = str(Path(str(self.config.hydra.sweep.dir)).absolute())
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")  # as Hydra's basic sweeper does
        self.cache_dir = str(Path(self.config.paths.cache_dir).expanduser().absolute())
        self.run_dirs: dict[int, str] = {}
        study = self._study()
        singleton_state = Singleton.get_state()
        owns_ray = not ray.is_initialized()  # else Ray was started by whoever called Hydra, and stays up
        init_ray(typed_settings(self.config.ray, RayConfig))
        concurrency = min(self._concurrency(), self.n_trials)
        log.info(f"Optuna ({self.sampler.value}) over {list(self.space)}: {self.n_trials} trials, "
                 f"{concurrency} at a time, as Ray tasks")
        run_trial = ray.remote(num_cpus=0, max_retries=0)(_run_trial)  # the stages reserve the CPUs
        running: dict = {}
        asked = 0  # not len(study.trials): that counts the grid's enqueued trials from the start
        try:
            while asked < self.n_trials or running:
                while asked < self.n_trials and len(running) < concurrency:
                    trial = study.ask(self.space)
                    asked += 1
                    config = self._trial_config(list(arguments), trial.number, trial.params)
                    ref = run_trial.options(name=f"trial:{trial.number}").remote(
                        self.hydra_context, self.task_function, config, singleton_state)
                    running[ref] = trial
                (ref,), _ = ray.wait(list(running), num_returns=1)
                trial = running.pop(ref)
                study.tell(trial, self._objective(ref, trial.number))
                self._write_results(study, sweep_dir)
        finally:  # an error or Ctrl-C: no trial goes on without the sweep
            for ref in running:
                ray.cancel(ref, force=True, recursive=True)
            if owns_ray:
                ray.shutdown()
        log.info(f"best of {asked} trials: {study.best_value} with {study.best_params}; "
                 f"{sweep_dir / RESULTS_FILE}")

    def _objective(self, ref, number: int) -> float:
        import ray

        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, TrialFailed):  # its message names the failed stage and its log
                raise SystemExit(f"error: trial #{number}: {str(err.cause).removeprefix('error: ')}") from None
            raise
        if value is None:
            raise SystemExit(f"error: trial #{number} returned no objective: `python -m pipeline` returns the "
                             "fine-tuning dev score, so keep the finetune stage in the run (pipeline.stages, "
                             "pipeline.until)")
        return float(value)

    def _write_results(self, study, sweep_dir: Path) -> None:
        from optuna.trial import TrialState

        done = [t for t in study.trials if t.state is TrialState.COMPLETE]
        results = {"name": "optuna_ray", "direction": self.direction.value,
                   "best_params": study.best_params, "best_value": study.best_value,
                   "trials": [{"number": t.number, "params": t.params, "value": t.value,
                               "run_dir": self.run_dirs[t.number]} for t in done]}
        OmegaConf.save(OmegaConf.create(results), sweep_dir / RESULTS_FILE)
