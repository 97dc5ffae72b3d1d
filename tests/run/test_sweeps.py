"""Sweeps (`python -m pipeline -m ...`): the members of a sweep share every stage their settings do not change.

A grid on the command line (`pretrain.lr=1e-3,2e-3`) is Hydra's basic sweeper: the members run one after another in
one process, each with its own run directory and Ray instance. A sweep config (conf/sweep/) selects the project's
optuna_ray sweeper (hydra_plugins/optuna_ray_sweeper): Optuna chooses the trials, each a Hydra job run as a Ray task,
as many at once as the Ray cluster's CPUs hold. Either way the content-addressed stage cache is what makes a later
member reuse an earlier one's stages."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

import hydra_plugins.optuna_ray_sweeper.optuna_ray_sweeper as plugin
from pipeline import CONF_DIR, status
from tests import sweep_tasks
from tests.pipeline_cli import (
    REPO_ROOT,
    pipeline_command,
    pipeline_env,
    ray_cluster,
    run_pipeline_cli,
    stage_executions,
)


@pytest.mark.slow
def test_a_grid_sweep_over_pretraining_prepares_the_data_once(tmp_path):
    result = run_pipeline_cli(tmp_path, ["pipeline.until=bert_pretrain", "pretrain.lr=1e-3,2e-3"], multirun=True)
    assert "Launching 2 jobs locally" in result.stdout + result.stderr
    for stage in ("prepare", "bert_tokenizer", "bert_examples"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage
    assert stage_executions(tmp_path / "cache", "bert_pretrain") == 2
    members = [{s.name: s for s in status.read_status(tmp_path / "multirun" / str(job))} for job in (0, 1)]
    assert [m["prepare"].state for m in members] == ["complete", "cached"]
    assert [m["bert_pretrain"].state for m in members] == ["complete", "complete"]
    assert members[0]["bert_pretrain"].hash != members[1]["bert_pretrain"].hash
    assert members[0]["bert_examples"].output == members[1]["bert_examples"].output


def sweep_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["+experiment=bert_tiny", *overrides], return_hydra_config=True)


def test_the_sweep_objective_is_the_pretrained_kinds_main_metric_whatever_the_family(tmp_path):
    """The objective averages the kinds with a random twin (bert, gpt, ...), each task on its first metric; the twins,
    baselines and encoder snapshots are not what a sweep maximises."""
    from pipeline.runner import finetune_objective

    def row(model, task, metric, score):
        return {"model": model, "task": task, "metric": metric, "score": score, "train_size": None}

    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "results.json").write_text(json.dumps([
        row("bert", "rt", "accuracy", 0.7), row("bert", "rt", "f1", 0.1), row("gpt", "stsb", "pearson", 0.5),
        row("bert_random", "rt", "accuracy", 0.0), row("bow_logreg", "rt", "accuracy", 0.0),
        row("bert@10", "rt", "accuracy", 0.0), row("bert_external", "rt", "accuracy", 0.0)]))
    assert finetune_objective(tmp_path) == pytest.approx(0.6)
    assert finetune_objective(tmp_path / "no_run") is None


def test_the_finetune_sweep_is_the_bert_papers_grid_searched_by_optuna():
    sweeper = instantiate(sweep_config("+sweep=finetune_lr_epochs").hydra.sweeper)
    # through the module: Hydra's plugin scan executes it again, defining its classes anew
    assert isinstance(sweeper, plugin.OptunaRaySweeper)
    assert (sweeper.direction, sweeper.sampler, sweeper.n_trials) == (plugin.Direction.maximize, plugin.Sampler.grid, 9)
    assert sweeper.space == {"finetune.lr": CategoricalDistribution([5e-5, 3e-5, 2e-5]),
                             "finetune.epochs": CategoricalDistribution([2, 3, 4])}


def test_the_bayesian_sweep_searches_ranges_with_tpe():
    sweeper = instantiate(sweep_config("+sweep=finetune_bayesian").hydra.sweeper)
    assert (sweeper.direction, sweeper.sampler, sweeper.n_trials) == (plugin.Direction.maximize, plugin.Sampler.tpe, 20)
    assert sweeper.space == {"finetune.lr": FloatDistribution(1e-4, 3e-3, log=True),
                             "finetune.epochs": IntDistribution(2, 5),
                             "finetune.warmup_fraction": FloatDistribution(0.0, 0.2)}


def test_a_misspelt_kind_fails_at_composition_naming_the_entry():
    with pytest.raises(ConfigCompositionException) as err:
        sweep_config("+sweep=finetune_bayesian", "hydra.sweeper.params={finetune.lr:{kind:logunif,low:1,high:2}}")
    cause = str(err.value.__cause__)
    assert "Invalid value 'logunif', expected one of [choice, uniform, loguniform, int]" in cause
    assert "hydra.sweeper.params.finetune.lr.kind" in cause


@pytest.mark.parametrize("overrides, message", [
    (["+sweep=finetune_bayesian", "hydra.sweeper.params={finetune.lr:{kind:loguniform,low:0,high:1e-3}}"],
     r"params\[finetune.lr\]: kind loguniform needs low > 0"),
    (["+sweep=finetune_bayesian", "hydra.sweeper.params={finetune.lr:{kind:uniform,low:1e-3,high:1e-4}}"],
     r"params\[finetune.lr\]: kind uniform takes `low` < `high`"),
    (["+sweep=finetune_bayesian", "hydra.sweeper.params={finetune.lr:{kind:choice}}"],
     r"params\[finetune.lr\]: kind choice takes `values: \[...\]`"),
    (["+sweep=finetune_bayesian", "hydra.sweeper.params={finetune.epochs:{kind:int,low:1.5,high:4}}"],
     r"params\[finetune.epochs\]: kind int takes whole numbers"),
    (["+sweep=finetune_bayesian", "hydra.sweeper.n_trials=null"], "sampler=tpe needs a number of trials"),
    (["+sweep=finetune_lr_epochs", "hydra.sweeper.n_trials=10"], "the grid has 9 points"),
    (["hydra/sweeper=optuna_ray", "hydra.sweeper.n_trials=2"], "hydra.sweeper.params is empty"),
    (["+sweep=finetune_lr_epochs", "++hydra.sweeper.params={finetune.warmup_fraction:{kind:uniform,low:0,high:1}}"],
     r"sampler=grid walks choices only; \['finetune.warmup_fraction'\]"),
])
def test_a_bad_search_space_fails_before_any_trial_saying_what_it_needs(overrides, message):
    with pytest.raises(InstantiationException, match=message):
        instantiate(sweep_config(*overrides).hydra.sweeper)


def _sweep_in_process(tmp_path: Path, task_function, *overrides: str) -> Path:
    sweep_dir = tmp_path / "multirun"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        GlobalHydra.instance().hydra.multirun(
            config_name="config", task_function=task_function, with_log_configuration=False,
            overrides=["+experiment=bert_tiny", "+sweep=finetune_lr_epochs", f"hydra.sweep.dir={sweep_dir}",
                       f"paths.cache_dir={tmp_path / 'cache'}", *overrides])
    return sweep_dir


def test_trials_run_side_by_side_where_the_cpus_allow_and_the_best_is_written(tmp_path, ray_session, monkeypatch):
    """Side by side as the sweeper hands the trials to Ray: both in flight before it waits for either (each trial's
    task reserves no CPU; its stages reserve ray.num_cpus=1 of the session Ray's 2). Not by the trials' clocks, which
    overlapped only where a fresh Ray worker started within a trial's patience, and not on a loaded machine."""
    import ray

    in_flight, wait = [], ray.wait

    def counted_wait(refs, **kwargs):
        in_flight.append(len(refs))
        return wait(refs, **kwargs)

    monkeypatch.setattr(ray, "wait", counted_wait)
    sweep_dir = _sweep_in_process(tmp_path, sweep_tasks.objective, "ray.num_cpus=1", "hydra.sweeper.n_trials=2")
    assert in_flight == [2, 1]  # both trials submitted at once, then the one left
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert sorted(t.number for t in results.trials) == [0, 1]
    best = max(results.trials, key=lambda t: t.value)
    assert (results.best_value, results.best_params) == (best.value, best.params)
    for trial in results.trials:
        params = trial.params
        assert trial.value == params["finetune.lr"] * 1e5 + params["finetune.epochs"]
        run_dir = Path(trial.run_dir)
        assert run_dir == sweep_dir / str(trial.number)
        overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        assert overrides[-2:] == [f"{key}={value}" for key, value in params.items()]


@pytest.mark.parametrize("task_function, message", [
    (sweep_tasks.failed_stage, "error: trial #0: stage pretrain failed; its log: /cache/stages/pretrain/x/stage.log"),
    (sweep_tasks.no_finetune, "error: trial #0 returned no objective: .* keep the finetune stage in the run"),
])
def test_a_failed_trial_ends_the_sweep_with_its_message(tmp_path, ray_session, task_function, message):
    with pytest.raises(SystemExit, match=message):
        _sweep_in_process(tmp_path, task_function, "hydra.sweeper.n_trials=1")


def test_values_listed_on_the_command_line_are_refused_not_ignored(tmp_path):
    with pytest.raises(SystemExit, match=r"\['finetune.warmup_fraction=0.0,0.1'\]: the optuna_ray sweeper searches"):
        _sweep_in_process(tmp_path, sweep_tasks.no_finetune, "finetune.warmup_fraction=0.0,0.1")


def test_a_sweep_config_without_multirun_is_refused_not_ignored(tmp_path):
    result = subprocess.run(pipeline_command(tmp_path, ["+sweep=finetune_lr_epochs"]), capture_output=True, text=True,
                            cwd=REPO_ROOT, env=pipeline_env(tmp_path), timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert "error: +sweep=finetune_lr_epochs configures a sweep, which Hydra runs with -m" in result.stderr


@pytest.mark.slow
def test_an_optuna_sweep_maximises_the_finetune_score_and_pretrains_once(tmp_path):
    run_pipeline_cli(tmp_path, ["+sweep=finetune_lr_epochs", "hydra.sweeper.n_trials=2",
                                "finetune.models=[bert]", "finetune.random_twins=false"], multirun=True)
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage
    assert stage_executions(tmp_path / "cache", "finetune") == 2
    scores = {job: row["score"] for job in (0, 1)
              for row in json.loads((tmp_path / "multirun" / str(job) / "finetune" / "results.json").read_text())
              if row["model"] == "bert"}
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert results.best_value == max(scores.values())
    settings = []
    for job in (job for job, score in scores.items() if score == results.best_value):  # the tiny model may tie
        trial = OmegaConf.load(tmp_path / "multirun" / str(job) / ".hydra" / "config.yaml").finetune
        settings.append({"finetune.lr": trial.lr, "finetune.epochs": trial.epochs})
    assert results.best_params in settings


@pytest.mark.slow
def test_on_a_cluster_trials_run_side_by_side_and_still_pretrain_once(tmp_path):
    with ray_cluster(tmp_path) as (port, _):
        # a 2-CPU cluster, 1 CPU per trial's stages: both trials at once
        result = run_pipeline_cli(tmp_path, ["+sweep=finetune_lr_epochs", "hydra.sweeper.n_trials=2",
                                             "finetune.models=[bert]", "finetune.random_twins=false",
                                             f"ray.address=127.0.0.1:{port}",
                                             "ray.num_cpus=1"], multirun=True, RAY_ADDRESS="")
    driver_log = result.stdout + result.stderr
    assert "Connecting to existing Ray cluster" in driver_log and "2 trials, 2 at a time" in driver_log
    started = [(tmp_path / "multirun" / str(job) / ".hydra" / "config.yaml").stat().st_mtime for job in (0, 1)]
    ended = [(tmp_path / "multirun" / str(job) / "pipeline.json").stat().st_mtime for job in (0, 1)]
    assert started[1] < ended[0] and started[0] < ended[1], (started, ended)  # side by side
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage
    assert stage_executions(tmp_path / "cache", "finetune") == 2
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert [t.number for t in results.trials] in ([0, 1], [1, 0])
