"""The files a task's YAML names: every one of them, interpolated, in the keys of the stages that read it, and only
inside finetune.data_dir unless a setting allows more (issue 55, defects 1 and 6)."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.downstream import tasks
from pipeline.engine.dag import stage_hashes
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import tiny_config, write_sentiment_task


def _reviews_task(tmp_path: Path, monkeypatch, train_file: str, dev_file: str) -> None:
    """A sentiment task `reviews` reading `train_file` and `dev_file`, in a task directory of its own."""
    task_dir = tmp_path / "tasks"
    task_dir.mkdir(exist_ok=True)
    (task_dir / "reviews.yaml").write_text(
        f"name: reviews\nbuiltin: null\nformat: tsv\ntrain_file: '{train_file}'\ndev_file: '{dev_file}'\n"
        "text_a: sentence\ntext_b: null\nlabel: label\nlabels: ['0', '1']\nmetric: accuracy\n")
    monkeypatch.setattr(tasks, "TASK_DIR", task_dir)


def _flip_labels(path: Path) -> None:
    header, *rows = path.read_text().splitlines()
    path.write_text("\n".join([header, *(f"{row[:-1]}{1 - int(row[-1])}" for row in rows)]) + "\n")


def _keys(cfg) -> dict[str, str]:
    return stage_hashes(cfg, STAGES, ["prepare", "finetune"])


@pytest.mark.parametrize("where", ["subfolder", "absolute", "parent", "interpolated"])
def test_every_file_a_task_reads_is_in_the_keys_of_finetune_and_prepare(where, tmp_path, monkeypatch):
    """Defect 1: only the top level of finetune.data_dir, and the YAML with its ${...} unresolved, were keyed, so dev
    labels flipped in a subfolder (or outside data_dir, or in a file an interpolation names) left `finetune: cached`
    with the old scores."""
    data, outside = tmp_path / "task", tmp_path / "outside"
    write_sentiment_task(data / "splits", seed=1)
    write_sentiment_task(outside, seed=2)
    monkeypatch.setenv("REVIEWS_TRAIN", "splits/train.tsv")
    train, dev = {"subfolder": ("splits/train.tsv", "splits/dev.tsv"),
                  "absolute": (str(outside / "train.tsv"), str(outside / "dev.tsv")),
                  "parent": ("../outside/train.tsv", "../outside/dev.tsv"),
                  "interpolated": ("${oc.env:REVIEWS_TRAIN,train.tsv}", "splits/dev.tsv")}[where]
    _reviews_task(tmp_path, monkeypatch, train, dev)
    cfg = tiny_config(tmp_path, ["finetune.task=reviews", "finetune.allow_files_outside_data_dir=true"])
    before = _keys(cfg)
    _flip_labels(outside / "dev.tsv" if where in ("absolute", "parent") else data / "splits" / "dev.tsv")
    flipped = _keys(cfg)
    assert flipped["finetune"] != before["finetune"]
    assert flipped["prepare"] != before["prepare"]  # decontamination reads the dev split's texts
    if where == "interpolated":  # another file named by the same YAML line
        monkeypatch.setenv("REVIEWS_TRAIN", "train.tsv")
        assert _keys(cfg)["finetune"] != flipped["finetune"]


def test_a_file_beside_the_task_files_that_no_task_reads_leaves_the_keys_alone(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path)
    before = _keys(cfg)
    (tmp_path / "task" / "README.txt").write_text("where these files came from\n")
    assert _keys(cfg) == before


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_a_task_file_outside_the_data_dir_is_refused_unless_allowed(where, tmp_path, monkeypatch):
    """Defect 6: absolute and ../ names in a task YAML were read as written, wherever they pointed."""
    tiny_config(tmp_path)  # writes the task
    (tmp_path / "task" / "splits").mkdir()
    outside = write_sentiment_task(tmp_path / "outside")
    dev = {"absolute": str(outside / "dev.tsv"), "parent": "splits/../../outside/dev.tsv"}[where]
    _reviews_task(tmp_path, monkeypatch, "train.tsv", dev)
    cfg = tiny_config(tmp_path, ["finetune.task=reviews"])
    message = (rf"task reviews: dev_file '{dev}' \(.*tasks/reviews\.yaml\) is outside finetune\.data_dir="
               rf"{tmp_path / 'task'}; move the file into that directory .* or set "
               r"finetune\.allow_files_outside_data_dir=true to read it where it is")
    with pytest.raises(ValueError, match=message):
        validate(cfg)  # at start-up
    with pytest.raises(ValueError, match=message):
        _keys(cfg)  # and by every stage that reads the file, which keys it first
    allowed = tiny_config(tmp_path, ["finetune.task=reviews", "finetune.allow_files_outside_data_dir=true"])
    validate(allowed)
    _keys(allowed)


def test_a_name_that_goes_up_and_back_into_the_data_dir_is_inside(tmp_path, monkeypatch):
    tiny_config(tmp_path)  # writes the task
    (tmp_path / "task" / "splits").mkdir()
    _reviews_task(tmp_path, monkeypatch, "splits/../train.tsv", "dev.tsv")
    validate(tiny_config(tmp_path, ["finetune.task=reviews"]))
