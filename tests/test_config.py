"""Every experiment composes; the command line tells the user what exists when a name is wrong."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline import CONF_DIR
from pipeline.downstream.finetune import task_names
from pipeline.downstream.tasks import load_task
from pipeline.runner import validate

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def test_there_are_experiments():
    assert "bert_tiny" in EXPERIMENTS


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes(name, tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}", f"paths.run_dir={tmp_path}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    assert resolved["experiment_name"] == name
    assert cfg.model._target_.startswith("models.")
    if cfg.finetune.data_dir:  # e.g. GLUE under ../shared, which a fresh clone has not: validate reads the files
        cfg.finetune.data_dir = str(_write_task_files(tmp_path / "tasks", task_names(cfg)))
    validate(cfg)


def _write_task_files(root: Path, names: list[str]) -> Path:
    """A one-example train and dev split of each TSV task, laid out as its YAML in conf/task/ describes."""
    for name in names:
        task = load_task(name)
        columns = [c for c in (task.text_a, task.text_b, task.label) if c is not None]
        label = str(task.labels[0]) if task.labels is not None else "0.5"
        if task.get("header", True):
            rows = [columns, [label if c == task.label else "some words" for c in columns]]
        else:
            rows = [[label if i == task.label else "some words" for i in range(max(columns) + 1)]]
        directory = root / task.data_subdir
        directory.mkdir(parents=True)
        for split in (task.train_file, task.dev_file):
            (directory / split).write_text("".join("\t".join(row) + "\n" for row in rows))
    return root


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_unknown_experiment_lists_the_available_ones():
    result = _cli("+experiment=no_such_experiment")
    assert result.returncode != 0
    assert "no_such_experiment" in result.stderr and "bert_tiny" in result.stderr


def test_help_works():
    result = _cli("--help")
    assert result.returncode == 0 and "experiment" in result.stdout


def test_validation_names_the_valid_choices(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=bert_tiny", f"paths.run_dir={tmp_path}",
                                                       "pipeline.stages=[prepare,pretrian]"])
    with pytest.raises(ValueError, match="valid stages"):
        validate(cfg)
    cfg.pipeline.stages = ["finetune"]
    cfg.finetune.task = "nope"
    with pytest.raises(ValueError, match="rotten_tomatoes"):
        validate(cfg)
    cfg.finetune.task = "sst2"
    cfg.data.corpus_dir = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="data.corpus_dir"):
        validate(cfg)
