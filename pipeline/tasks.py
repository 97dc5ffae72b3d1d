"""Downstream task registry: one YAML per task in conf/task/, TSV files read with errors that name file and line."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from data_prep.builtin import BUILTIN_TASK_DATA
from pipeline import CONF_DIR

TASK_DIR = CONF_DIR / "task"


def available_tasks() -> list[str]:
    return sorted(p.stem for p in TASK_DIR.glob("*.yaml"))


def load_task(name: str) -> DictConfig:
    path = TASK_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(available_tasks())} "
                         f"(add one with a YAML file in {TASK_DIR})")
    return OmegaConf.load(path)


def resolve_task_dir(task: DictConfig, data_dir: str | None, cache_dir: str) -> Path:
    """The directory holding the task's files: the user's data_dir, else the task's built-in data."""
    if data_dir:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"task {task.name}: data directory {path} does not exist; "
                                    f"pass finetune.data_dir=DIR with {task.train_file} and {task.dev_file}")
        return path
    if task.builtin:
        return BUILTIN_TASK_DATA[task.builtin](cache_dir)
    raise ValueError(f"task {task.name} has no built-in data: pass finetune.data_dir=DIR "
                     f"with {task.train_file} and {task.dev_file}")


@dataclass
class TaskSplit:
    texts_a: list[str]
    texts_b: list[str] | None
    labels: list[int]


def read_split(task: DictConfig, path: Path) -> TaskSplit:
    """Read one TSV split; labels are mapped to 0..n-1 in the order of the task's label list."""
    if not path.is_file():
        raise FileNotFoundError(f"task {task.name}: {path} not found")
    label_index = {str(label): i for i, label in enumerate(task.labels)}
    texts_a, texts_b, labels = [], [] if task.text_b else None, []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header row and examples")
        columns = [c for c in (task.text_a, task.text_b, task.label) if c]
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; header has {header}")
        col = {name: header.index(name) for name in columns}
        for line_no, row in enumerate(reader, start=2):
            if len(row) < len(header):
                raise ValueError(f"{path}:{line_no}: expected {len(header)} tab-separated fields, got {len(row)}")
            label = row[col[task.label]].strip()
            if label not in label_index:
                raise ValueError(f"{path}:{line_no}: unknown label {label!r}; task {task.name} "
                                 f"has labels {list(label_index)}")
            texts_a.append(row[col[task.text_a]])
            if texts_b is not None:
                texts_b.append(row[col[task.text_b]])
            labels.append(label_index[label])
    if not labels:
        raise ValueError(f"{path}: no examples after the header")
    return TaskSplit(texts_a, texts_b, labels)
