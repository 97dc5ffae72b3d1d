"""Sweeps (`python -m pipeline -m ...`): the members of a sweep share every stage their settings do not change.

Hydra's basic launcher runs the members one after another in one process, each with its own run directory
(`paths.run_dir` is the member's output directory) and its own Ray instance; the content-addressed stage cache is
what makes the second member reuse the first one's data preparation."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from pipeline import CONF_DIR, status
from tests.pipeline_cli import run_pipeline_cli, stage_executions


@pytest.mark.slow
def test_a_grid_sweep_over_pretraining_prepares_the_data_once(tmp_path):
    result = run_pipeline_cli(tmp_path, ["pipeline.until=pretrain", "pretrain.lr=1e-3,2e-3"], multirun=True)
    assert "Launching 2 jobs locally" in result.stdout + result.stderr
    for stage in ("prepare", "tokenizer", "examples"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage
    assert stage_executions(tmp_path / "cache", "pretrain") == 2
    members = [{s.name: s for s in status.read_status(tmp_path / "multirun" / str(job))} for job in (0, 1)]
    assert [m["prepare"].state for m in members] == ["complete", "cached"]
    assert [m["pretrain"].state for m in members] == ["complete", "complete"]
    assert members[0]["pretrain"].hash != members[1]["pretrain"].hash
    assert members[0]["examples"].output == members[1]["examples"].output


def test_the_finetune_sweep_is_the_bert_papers_grid_searched_by_optuna():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=bert_tiny", "+sweep=finetune_lr_epochs"],
                      return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweeper.sampler._target_ == "optuna.samplers.GridSampler"
    assert sweeper.direction == "maximize"
    assert dict(sweeper.params) == {"finetune.lr": "choice(5e-5, 3e-5, 2e-5)", "finetune.epochs": "choice(2, 3, 4)"}
    assert sweeper.n_trials == 9  # the whole grid


@pytest.mark.slow
def test_an_optuna_sweep_maximises_the_finetune_score_and_pretrains_once(tmp_path):
    result = run_pipeline_cli(tmp_path, ["+sweep=finetune_lr_epochs", "hydra.sweeper.n_trials=2",
                                         "finetune.models=[pretrained]"], multirun=True)
    for stage in ("prepare", "tokenizer", "examples", "pretrain"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage
    assert stage_executions(tmp_path / "cache", "finetune") == 2
    scores = [row["score"] for job in (0, 1)
              for row in json.loads((tmp_path / "multirun" / str(job) / "finetune" / "results.json").read_text())
              if row["model"] == "pretrained"]
    best = (tmp_path / "multirun" / "optimization_results.yaml").read_text()
    assert f"best_value: {max(scores)}" in best, (best, scores, result.stdout[-2000:])
