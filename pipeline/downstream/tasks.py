"""Downstream task registry: one YAML per task in tasks/, TSV files read with errors that name file and line."""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from data_prep.corpus.builtin import BUILTIN_TASK_DATA
from data_prep.corpus.ingest import corpus_form
from data_prep.tasks.encoding import not_utf8
from pipeline import CONF_DIR
from pipeline.engine.fingerprints import memoised_digests

# A field of csv's default limit, 131,072 characters, refused a long document (texts are cut to
# finetune.max_seq_length tokens anyway) with an error naming no file
csv.field_size_limit(2**31 - 1)

# Beside conf/, not in it: every folder of conf/ is a Hydra config group, and `+task=cola` would then compose a key
# that nothing reads. A run picks its tasks with finetune.task.
TASK_DIR = CONF_DIR.parent / "tasks"


def task_names(task: str | Sequence[str]) -> list[str]:
    """The names finetune.task gives: one name or a list of them."""
    return [task] if isinstance(task, str) else list(task)


def available_tasks() -> list[str]:
    return sorted(p.stem for p in TASK_DIR.glob("*.yaml"))


# What every task's YAML states (null where it has none: builtin without built-in data, labels for a regression task,
# SQuAD's); a TSV or generation task also names its columns
REQUIRED_KEYS = ("name", "builtin", "format", "train_file", "dev_file", "labels", "metric")
COLUMN_KEYS = ("text_a", "text_b", "label")


def load_task(name: str) -> DictConfig:
    # a name is a file of tasks/ and nothing else: `../x` or `sub/x` would read a YAML from outside the registry
    if name not in available_tasks():
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(available_tasks())} "
                         f"(add one with a YAML file in {TASK_DIR})")
    path = TASK_DIR / f"{name}.yaml"
    task = OmegaConf.load(path)
    if not isinstance(task, DictConfig):
        raise ValueError(f"{path}: a task is a mapping of keys (see {TASK_DIR / 'sst2.yaml'}), not a list")
    required = REQUIRED_KEYS + (COLUMN_KEYS if task.get("format") in ("tsv", "seq2seq") else ())
    missing = [key for key in required if key not in task]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing}; a task states {', '.join(REQUIRED_KEYS)} (null where it "
                         f"has none: builtin without built-in data, labels for a regression task), a TSV or "
                         f"generation task also {', '.join(COLUMN_KEYS)} (see {TASK_DIR / 'sst2.yaml'})")
    if task.name != name:  # results, finished runs and messages go by the name, which points back at this file
        raise ValueError(f"{path}: name {task.name!r} is not the file's name; set name: {name}")
    labels = list(task.get("labels") or [])
    repeated = [label for label in dict.fromkeys(labels) if labels.count(label) > 1]
    if repeated:
        # a label's position is its class id: a repeat gives one name two classes, of which the second never occurs
        raise ValueError(f"{path}: labels {labels} name {repeated} more than once; list each class once")
    task_min_steps(task)  # a bad value fails here, at start-up, not after pretraining
    return task


def in_corpus_form(task: DictConfig, nfkc: bool, chinese_variant: str) -> DictConfig:
    """The task as a run reads it whose corpus prepare normalised (data.nfkc, data.chinese_variant): its texts are
    given the same Unicode form and Chinese script as the pretraining text, so that a tokenizer trained on simplified
    characters reads a task written in traditional ones (爲, 臨, 曉) as the characters it knows instead of [UNK]. The
    task's own files are left as they are; a run whose corpus is read as it is reads its tasks as they are."""
    if not nfkc and chinese_variant == "keep":
        return task
    return OmegaConf.merge(task, {"text_form": {"nfkc": nfkc, "chinese_variant": chinese_variant}})


def text_form(task: DictConfig) -> Callable[[str], str]:
    """What in_corpus_form gave the task to do to each of its texts (the identity where nothing)."""
    form = task.get("text_form")
    if form is None:
        return lambda text: text
    nfkc, variant = bool(form.nfkc), str(form.chinese_variant)
    return lambda text: corpus_form(text, nfkc, variant)


SCORE_SPLITS = ("dev", "test")


def scored_task(task: DictConfig, split: str) -> DictConfig:
    """The task as fine-tuning reads it when `split` (finetune.score_split) is scored: as it is for dev; for test, its
    test file in place of its dev file, so that every reader scores the test split where it scored dev. Report test
    only for settings chosen without it (on dev or on finetune.selection_fraction's held-out train)."""
    if split not in SCORE_SPLITS:
        raise ValueError(f"finetune.score_split={split!r}: use one of {list(SCORE_SPLITS)}")
    if split == "dev":
        return task
    if not task.get("test_file"):
        raise ValueError(f"task {task.name} has no test split (no test_file in {TASK_DIR / task.name}.yaml): score it "
                         "on dev (finetune.score_split=dev)")
    return OmegaConf.merge(task, {"dev_file": task.test_file})


def resolve_task_dir(task: DictConfig, data_dir: str | None, cache_dir: str) -> Path:
    """The directory holding the task's files: the user's data_dir (or its `data_subdir`, so that one root such
    as GLUE's serves several tasks), else the task's built-in data."""
    if data_dir:
        path = Path(data_dir).expanduser()
        if task.get("data_subdir") and (path / task.data_subdir).is_dir():
            path = path / task.data_subdir
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"task {task.name}: finetune.data_dir={data_dir} is a file, not a directory; "
                                     f"pass the directory that holds {task.train_file} and {task.dev_file} (for "
                                     f"this file, its folder: finetune.data_dir={path.parent})")
        if not path.is_dir():
            raise FileNotFoundError(f"task {task.name}: data directory {path} does not exist; "
                                    f"pass finetune.data_dir=DIR with {task.train_file} and {task.dev_file}")
        return path
    if task.builtin:
        return BUILTIN_TASK_DATA[task.builtin].fetch(cache_dir)
    raise ValueError(f"task {task.name} has no built-in data: pass finetune.data_dir=DIR "
                     f"with {task.train_file} and {task.dev_file}")


# Keys of a task's YAML that say how it is trained or its outputs scored, prompted or written, not which texts it
# holds: what reads only the texts (prepare's decontamination) leaves them out of its key, so a new beam width or step
# floor reruns fine-tuning alone
SCORING_KEYS = ("metric", "num_beams", "length_penalty", "no_repeat_ngram_size", "max_target_tokens",
                "exact_match_ignore_case", "prompt_template", "prompt_label_words", "min_steps")


def task_min_steps(task: DictConfig) -> int:
    """The fewest optimizer steps a fine-tuning run of the task takes (its YAML's `min_steps`, 0 where it has none):
    a floor beside finetune.min_steps, for a task that needs more passes over a small train set than a sentence
    classifier does (a tagger, docs/pretraining_recipes.md "Every shipped task")."""
    steps = task.get("min_steps", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"task {task.name}: min_steps {steps!r} ({TASK_DIR / task.name}.yaml) is not a number of "
                         "steps; give a whole number, 0 or more, or remove the key")
    return steps


def scoring_options(task: DictConfig) -> dict:
    """What a task's YAML says of how its metric compares outputs, as score_task's options: a generation task's
    exact match ignores case where it sets exact_match_ignore_case (absent: case counts, an exact answer is exact)."""
    if task.format != "seq2seq":
        return {}
    return {"ignore_case": bool(task.get("exact_match_ignore_case", False))}


# Every file a task's YAML may name, read from finetune.data_dir (or the built-in data's directory)
TASK_FILE_KEYS = ("train_file", "dev_file", "test_file")


def task_files(task: DictConfig, data_dir: Path, allow_outside: bool = False) -> dict[str, Path]:
    """YAML key -> path of every file the task reads (train_file, dev_file, test_file where it has one), as the YAML
    names it once interpolated, under `data_dir`. A name that leaves data_dir (absolute, or up through `..`) is
    refused unless `allow_outside` (finetune.allow_files_outside_data_dir)."""
    names = {key: str(task[key]) for key in TASK_FILE_KEYS if task.get(key)}
    for key, name in names.items():
        if not allow_outside and (Path(name).is_absolute() or os.path.normpath(name).split(os.sep)[0] == ".."):
            raise ValueError(f"task {task.name}: {key} {name!r} ({TASK_DIR / task.name}.yaml) is outside "
                             f"finetune.data_dir={data_dir}; move the file into that directory and name it relative "
                             "to it, or set finetune.allow_files_outside_data_dir=true to read it where it is")
    return {key: data_dir / name for key, name in names.items()}


def task_data_fingerprint(task: DictConfig, data_dir: str | None, cache_dir: str, texts_only: bool = False,
                          allow_outside: bool = False) -> str:
    """The task as a stage reads it: its definition (the YAML as loaded and interpolated: files, columns, labels,
    metric, decoding; texts_only: less SCORING_KEYS) and the contents of every file it reads (task_files, in the
    directory of resolve_task_dir; or the built-in data's pinned release: planning never downloads). An edit to the
    YAML alone (num_beams, a label) changes what fine-tuning computes, so it changes the key too. Refuses files
    outside the data directory as task_files does (`allow_outside`), so every stage that reads a task's files has
    been refused them before it starts."""
    loaded = OmegaConf.to_container(task, resolve=True)
    fields = {k: v for k, v in loaded.items() if not (texts_only and k in SCORING_KEYS)}
    definition = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    if not data_dir and task.builtin:
        return definition + BUILTIN_TASK_DATA[task.builtin].fingerprint
    paths = list(task_files(task, resolve_task_dir(task, data_dir, cache_dir), allow_outside).values())
    listing = list(zip(map(str, paths), memoised_digests(paths, cache_dir, "\0".join(map(str, paths)))))
    return definition + hashlib.sha256(json.dumps(listing).encode()).hexdigest()


@dataclass
class TaskSplit:
    texts_a: list[str]
    texts_b: list[str] | None
    labels: list[int] | list[float] | list[str]  # a seq2seq task's: the target texts


def _label(task: DictConfig, label_index: dict[str, int] | None, raw: str, where: str) -> int | float | str:
    if task.format == "seq2seq":  # a generation task: the label column is the target text
        return raw
    if label_index is None:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{where}: label {raw!r} is not a number; task {task.name} is a regression task "
                             "(labels: null)") from None
        if not math.isfinite(value):  # float() reads nan and inf, which make every loss and score nan
            raise ValueError(f"{where}: label {raw!r} is not a finite number; task {task.name} is a regression task "
                             "(labels: null): give the row its score, or remove it")
        return value
    if raw not in label_index:
        raise ValueError(f"{where}: unknown label {raw!r}; task {task.name} has labels {list(label_index)} "
                         f"(fix the file, or add the label to {TASK_DIR / task.name}.yaml)")
    return label_index[raw]


def read_split(task: DictConfig, path: Path) -> TaskSplit:
    """Read one TSV split. Labels are mapped to 0..n-1 in the order of the task's label list, or read as floats
    when the task has `labels: null` (regression, STS-B), or kept as text (`format: seq2seq`: the target). With
    `header: false` (CoLA) the files have no header row and text_a/text_b/label are 0-based column indices."""
    if not path.is_file():
        where = f"finetune.data_dir (or its {task.data_subdir} subdirectory)" if task.get("data_subdir") \
            else "finetune.data_dir"
        raise FileNotFoundError(f"task {task.name}: {path} not found; {where} should hold {task.train_file} and "
                                f"{task.dev_file}")
    # utf-8-sig: GLUE's MRPC files start with a byte-order mark, which would otherwise prefix the first column name
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            return _read_rows(task, path, reader)
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None
        except csv.Error as error:
            raise ValueError(f"{path}:{reader.line_num}: {error}; fix the row") from None


def _read_rows(task: DictConfig, path: Path, reader) -> TaskSplit:
    """read_split's rows of an open file, each checked as it comes."""
    label_index = None if task.labels is None else {str(label): i for i, label in enumerate(task.labels)}
    columns = [c for c in (task.text_a, task.text_b, task.label) if c is not None]
    form = text_form(task)
    texts_a, texts_b, labels = [], [] if task.text_b is not None else None, []
    if task.get("header", True):
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header row and examples")
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; header has {header}. Rename the file's "
                             f"columns, or set text_a/text_b/label in {TASK_DIR / task.name}.yaml to its names")
        col = {name: header.index(name) for name in columns}
        width, first_line, shape_of = len(header), 2, "header"
    else:
        col = {index: index for index in columns}
        width, first_line, shape_of = None, 1, "first line"  # the first row's width
    needed = max(col.values()) + 1
    for line_no, row in enumerate(reader, start=first_line):
        width = width or len(row)
        # Every row has as many fields as the file's header (or first row): one with more is as broken as one
        # with fewer (a tab inside a text, a stray column), and which of its fields is the label is a guess.
        if width < needed:
            raise ValueError(f"{path}:{line_no}: expected {needed} tab-separated fields (task {task.name} reads "
                             f"column {needed - 1}, counting from 0), got {len(row)}")
        if len(row) != width:
            raise ValueError(f"{path}:{line_no}: expected {width} tab-separated fields, as on the file's "
                             f"{shape_of}, got {len(row)}; fix the row (a tab inside a text must be removed)")
        label = _label(task, label_index, row[col[task.label]].strip(), f"{path}:{line_no}")
        labels.append(form(label) if isinstance(label, str) else label)  # a generation target is text
        texts_a.append(form(row[col[task.text_a]]))
        if texts_b is not None:
            texts_b.append(form(row[col[task.text_b]]))
    if not labels:
        raise ValueError(f"{path}: no examples" + (" after the header" if task.get("header", True) else ""))
    return TaskSplit(texts_a, texts_b, labels)
