"""The files a task's YAML names: every one of them, interpolated, in the keys of the stages that read it, and only
inside finetune.data_dir unless a setting allows more; and what its splits hold together,
checked at start-up (defects 9 and 16)."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.downstream import tasks
from pipeline.downstream.task_data import read_task_files
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


def _nli_task(root: Path, train_labels: list[str], dev_labels: list[str]):
    """A three-label pair task whose train and dev splits carry the labels given, one example each, no text in
    both."""
    root.mkdir()
    for name, labels in (("train.tsv", train_labels), ("dev.tsv", dev_labels)):
        (root / name).write_text("premise\thypothesis\tlabel\n"
                                 + "".join(f"{name} p {i}\th {i}\t{label}\n" for i, label in enumerate(labels)))
    return OmegaConf.create({"name": "nli", "format": "tsv", "train_file": "train.tsv", "dev_file": "dev.tsv",
                             "text_a": "premise", "text_b": "hypothesis", "label": "label",
                             "labels": ["entailment", "neutral", "contradiction"], "metric": "accuracy"})


def test_a_train_split_of_one_label_is_refused(tmp_path):
    """Defect 9: it failed inside scikit-learn's LogisticRegressionCV (bow_logreg), after every model had trained."""
    task = _nli_task(tmp_path / "nli", ["neutral"] * 5, ["neutral", "entailment"])
    with pytest.raises(ValueError, match=r"nli/train\.tsv: every one of its 5 examples has label 'neutral'; task nli "
                                         r"needs at least two of its labels \['entailment', 'neutral', "
                                         r"'contradiction'\] in the train split .*: add examples of another label"):
        read_task_files(task, tmp_path / "nli")


def test_dev_labels_that_train_never_has_are_counted_in_a_warning(tmp_path, capsys):
    """Defect 16: a quarter of dev carrying a label train lacks capped accuracy at 0.75, without a word."""
    task = _nli_task(tmp_path / "nli", ["entailment", "neutral"] * 3,
                     ["entailment", "neutral", "contradiction", "entailment"] * 2)
    read_task_files(task, tmp_path / "nli")
    assert capsys.readouterr().out == (
        f"WARNING: {tmp_path / 'nli' / 'dev.tsv'}: 2 of its 8 examples (25%) have a label that train.tsv never has: "
        "'contradiction' (2); no model learns to predict it, so accuracy there is at most 0.75\n")
    (tmp_path / "nli" / "train.tsv").write_text("premise\thypothesis\tlabel\np\th\tcontradiction\n"
                                                "p\th\tentailment\np\th\tneutral\n")
    read_task_files(task, tmp_path / "nli")
    assert capsys.readouterr().out == ""


def test_empty_generation_targets_are_counted_in_a_warning(tmp_path, capsys):
    """Defect 16: a headline task's rows with an empty target trained and scored without a word."""
    task = tasks.load_task("bbc_headlines")
    for name, targets in (("train.tsv", ["a", "", "b", ""]), ("dev.tsv", ["c", "d"]), ("test.tsv", [" ", "e"])):
        (tmp_path / name).write_text("source\ttarget\n" + "".join(f"{name} article {i}\t{target}\n"
                                                                 for i, target in enumerate(targets)))
    read_task_files(task, tmp_path)
    assert capsys.readouterr().out.splitlines() == [
        f"WARNING: {tmp_path / name}: {n} of its {total} examples have an empty target (column 'target') and task "
        "bbc_headlines generates targets; fill them in, or remove the rows"
        for name, n, total in (("train.tsv", 2, 4), ("test.tsv", 1, 2))]


def test_evaluation_examples_that_are_also_training_examples_are_counted_in_a_warning(tmp_path, capsys):
    """A dev split sharing examples with train, or the train file itself as dev_file, was scored
    without a word."""
    task = _nli_task(tmp_path / "nli", ["entailment", "neutral"] * 2, ["neutral"] * 4)
    train = tmp_path / "nli" / "train.tsv"
    with train.open("a") as f:
        f.write("dev.tsv p 1\th 1\tneutral\n")  # dev's second example, and a premise alone that dev has too
        f.write("dev.tsv p 2\th 9\tneutral\n")
    read_task_files(task, tmp_path / "nli")
    assert capsys.readouterr().out == (
        f"WARNING: {tmp_path / 'nli' / 'dev.tsv'}: 1 of its 4 examples (25%) have the text of an example of train.tsv; "
        "a score there is partly recall of training examples: remove them from one of the files\n")
    read_task_files(OmegaConf.merge(task, {"dev_file": "train.tsv"}), tmp_path / "nli")
    assert "6 of its 6 examples (100%) have the text of an example of train.tsv" in capsys.readouterr().out
