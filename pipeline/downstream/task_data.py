"""A downstream task read once per fine-tune stage, for any model kind: its splits (a held-out part of train in
place of dev when selecting a recipe), subsets of train, and what builds the model and LightningModule for it."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from omegaconf import DictConfig

from data_prep.tasks.conll import TaggedSentence, iob1_to_iob2, read_conll
from data_prep.tasks.squad import read_squad
from pipeline.data_settings import DataConfig
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.tasks import (
    TaskSplit,
    in_corpus_form,
    load_task,
    read_split,
    resolve_task_dir,
    scored_task,
    task_files,
    task_names,
    text_form,
)
from pipeline.engine.settings import cache_dir_of, typed_settings
from pipeline.evaluation.metrics import score_task


@dataclass
class TaskData:
    """A task encoded once with one tokenizer, with what builds its model head and LightningModule."""
    train: list
    dev: list
    collate: Callable
    make_model: Callable       # BertConfig -> task model with an `.encoder` (ELMo: None -> head on the biLM)
    make_module: Callable      # (model, lr=, weight_decay=, warmup_steps=, total_steps=) -> LightningModule
    majority_scores: dict[str, float] | None  # majority-class baseline, for classification tasks only
    train_labels: list | None = None  # class of each train example, for stratified subsets; None: not a class task
    # the padded length of each train example, for batches of similar lengths (finetune.group_by_length); None: the
    # kind pads nothing that costs work (frozen sentence vectors)
    train_lengths: list[int] | None = None


def length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                           pool_batches: int = 50) -> list[np.ndarray]:
    """One epoch of batches (positions into `lengths`): the examples shuffled, each pool of `pool_batches` batches'
    worth sorted by length and cut into batches, then the batches shuffled. A batch is padded to its longest example,
    so batches of similar lengths pad little (HF Trainer's group_by_length, AllenNLP's bucket sampler), while every
    batch is still drawn from a random pool and comes in random order. Only the last batch can be short."""
    order = rng.permutation(len(lengths))
    pool = batch_size * pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


class LengthGroupedBatchSampler:
    """A DataLoader batch_sampler drawing length_grouped_batches anew each epoch, from (seed, epoch)."""

    def __init__(self, lengths, batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed, self.epoch = np.asarray(lengths), batch_size, seed, 0

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        for batch in length_grouped_batches(self.lengths, self.batch_size, rng):
            yield batch.tolist()


def stratified_subsample(labels: list | None, size: int | None, count: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of `size` of the `count` training examples (all of them for size None or >= count), drawn
    without replacement by `rng`. With class labels, each class gets its share of the size (largest remainder) so
    that a small subset keeps the label distribution, as few-shot learning curves do (e.g. Gao et al. 2021)."""
    if size is None or size >= count:
        return np.arange(count)
    if labels is None:
        return np.sort(rng.choice(count, size, replace=False))
    labels = np.asarray(labels)
    classes, frequencies = np.unique(labels, return_counts=True)
    quota = frequencies * size / count
    take = np.floor(quota).astype(int)
    for c in np.argsort(-(quota - take), kind="stable")[: size - int(take.sum())]:
        take[c] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), k, replace=False) for c, k in zip(classes, take) if k]
    return np.sort(np.concatenate(picked))


def subsample(items: list, limit: int | None, seed: int) -> list:
    if not limit or len(items) <= limit:
        return items
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), limit))]


def held_out_indices(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(rest, held out), each in file order: a random `fraction` of a train split's `n` examples (sentences, for a
    tagging task) held out to score on in its dev split's place, so that settings are chosen without reading the dev
    set they are reported on (finetune.selection_fraction)."""
    order = np.random.default_rng(seed).permutation(n)
    cut = max(1, int(round(fraction * n)))
    return sorted(order[cut:].tolist()), sorted(order[:cut].tolist())


def split_off(train: TaskSplit, fraction: float, seed: int) -> tuple[TaskSplit, TaskSplit]:
    """(rest, held out) of a TSV task's train split (held_out_indices)."""
    def part(indices: list[int]) -> TaskSplit:
        return TaskSplit([train.texts_a[i] for i in indices],
                         None if train.texts_b is None else [train.texts_b[i] for i in indices],
                         [train.labels[i] for i in indices])

    rest, held_out = held_out_indices(len(train.labels), fraction, seed)
    return part(rest), part(held_out)


def tsv_splits(task: DictConfig, data_dir: Path, max_train_examples: int | None, seed: int,
                selection_fraction: float | None = None) -> tuple[TaskSplit, TaskSplit, dict[str, float] | None]:
    """A TSV task's train split (subsampled to `max_train_examples`) and dev split (a held-out part of train with
    `selection_fraction`), and the dev scores of always predicting the train split's most frequent label (None for a
    regression task)."""
    train, dev = read_split(task, data_dir / task.train_file), read_split(task, data_dir / task.dev_file)
    if selection_fraction:
        train, dev = split_off(train, selection_fraction, seed)
    keep = subsample(list(range(len(train.labels))), max_train_examples, seed)
    train = TaskSplit([train.texts_a[i] for i in keep], None if train.texts_b is None else
                      [train.texts_b[i] for i in keep], [train.labels[i] for i in keep])
    if task.labels is None:
        return train, dev, None
    majority = int(np.bincount(train.labels).argmax())
    return train, dev, score_task(task.metric, [majority] * len(dev.labels), dev.labels)


def repeated(values: list) -> list:
    """The values given more than once, each once, in the order first given."""
    return [v for v in dict.fromkeys(values) if values.count(v) > 1]


def scored_tasks(cfg: DictConfig, f: FinetuneConfig) -> list[DictConfig]:
    """finetune.task's tasks as fine-tuning reads them: scored on finetune.score_split's split (scored_task), their
    text in the form prepare gave the corpus (in_corpus_form)."""
    if f.selection_fraction and f.score_split != "dev":
        raise ValueError(f"finetune.selection_fraction scores a held-out part of the train split and "
                         f"finetune.score_split={f.score_split} the {f.score_split} split: set one of them")
    names = task_names(f.task)
    if repeated(names):
        raise ValueError(f"finetune.task={names} repeats {repeated(names)}: a repeated task's rows would be counted "
                         "again, as if from more seeds; give each task once")
    tasks = [load_task(name) for name in names]
    if f.selection_fraction and (squad := [task.name for task in tasks if task.format == "squad"]):
        raise ValueError(f"finetune.selection_fraction holds out part of a task's train split (its sentences or "
                         f"pairs), not of a SQuAD file's articles; task {squad[0]} is squad: leave it null for this "
                         f"task")
    data = typed_settings(cfg.data, DataConfig)
    return [in_corpus_form(scored_task(task, str(f.score_split)), data.nfkc, str(data.chinese_variant))
            for task in tasks]


def train_pool_documents(cfg: DictConfig, f: FinetuneConfig, reader: str) -> list[list[str]]:
    """The texts of every example fine-tuning may train on, one document per example (its text, and its pair's):
    each of finetune.task's train splits as fine-tuning reads it (tsv_splits: subsampled to finetune.max_train_examples,
    less finetune.selection_fraction's held-out part), never a dev, test or held-out text. What a model may read
    unlabelled before fine-tuning without reading what it is scored on (task-adaptive pretraining, Gururangan et al.
    2020); `reader` names it in the message refusing a task that is not a TSV task."""
    documents = []
    for task in scored_tasks(cfg, f):
        if task.format != "tsv":
            raise ValueError(f"{reader} reads the train texts of a TSV task; task {task.name} is {task.format}: "
                             f"remove {reader} from pipeline.stages, or fine-tune on TSV tasks only")
        data_dir = resolve_task_dir(task, f.data_dir, cache_dir_of(cfg))
        train, _, _ = tsv_splits(task, data_dir, f.max_train_examples, cfg.seed, f.selection_fraction)
        documents += [list(texts) for texts in zip(train.texts_a, *([train.texts_b] if train.texts_b else []))]
    return documents


TAG_SCHEMES = ("iob", "none")


def conll_sentences(task: DictConfig, data_dir: Path, name: str) -> list[TaggedSentence]:
    """A CoNLL file's sentences, the word and the tag read from the task's `word_column` and `tag_column` (default:
    the first and the last). `tag_scheme: iob` (the default) tags chunks, read as IOB1 or IOB2 and given as IOB2
    (CoNLL-2003's files are IOB1); `none` takes the tags as they are (POS tags)."""
    scheme = task.get("tag_scheme", "iob")
    if scheme not in TAG_SCHEMES:
        raise ValueError(f"task {task.name}: tag_scheme {scheme!r} is not one of {list(TAG_SCHEMES)}; "
                         "iob for chunks (NER, chunking), none for tags without spans (POS)")
    sentences = read_conll(data_dir / name, task.labels, int(task.get("word_column", 0)),
                           int(task.get("tag_column", -1)), iob=scheme == "iob")
    form = text_form(task)  # word by word: each keeps its tag
    return [TaggedSentence([form(token) for token in s.tokens], s.tags if scheme == "none" else iob1_to_iob2(s.tags))
            for s in sentences]


def conll_splits(task: DictConfig, data_dir: Path, max_train_examples: int | None, seed: int,
                 selection_fraction: float | None = None) -> tuple[list[TaggedSentence], list[TaggedSentence]]:
    """A CoNLL task's train sentences (subsampled to `max_train_examples`) and dev sentences (with
    `selection_fraction`, a held-out part of train's sentences instead: tsv_splits' rule for a tagging task)."""
    train = conll_sentences(task, data_dir, task.train_file)
    if selection_fraction:
        rest, held_out = held_out_indices(len(train), selection_fraction, seed)
        train, dev = [train[i] for i in rest], [train[i] for i in held_out]
    else:
        dev = conll_sentences(task, data_dir, task.dev_file)
    return subsample(train, max_train_examples, seed), dev


def majority_tag_scores(task: DictConfig, train: list[TaggedSentence], dev: list[TaggedSentence]) -> dict[str, float]:
    """The dev scores of tagging each word (character, in segmentation) with its most frequent tag in train, and a word
    train never had with train's most frequent tag: the majority-class baseline of a tagging task (for POS tagging
    the classic "most frequent tag" baseline, ~90 % on the Penn Treebank; Charniak et al. 1993)."""
    by_word: dict[str, Counter] = {}
    for sentence in train:
        for token, tag in zip(sentence.tokens, sentence.tags):
            by_word.setdefault(token, Counter())[tag] += 1
    overall = Counter(tag for sentence in train for tag in sentence.tags).most_common(1)[0][0]
    best = {token: counts.most_common(1)[0][0] for token, counts in by_word.items()}
    predictions = [[best.get(token, overall) for token in sentence.tokens] for sentence in dev]
    return score_task(task.metric, predictions, [sentence.tags for sentence in dev])


SPLIT_READERS: dict[str, Callable[[DictConfig, Path, str], object]] = {
    "tsv": lambda task, data_dir, name: read_split(task, data_dir / name),
    "seq2seq": lambda task, data_dir, name: read_split(task, data_dir / name),
    "conll": conll_sentences,
    "squad": lambda task, data_dir, name: read_squad(data_dir / name),
}


def _texts(split) -> list[str]:
    """The text of a split as a reader gives it: sentences (and their pairs, and generation targets), tagged
    sentences' words, SQuAD's contexts and questions."""
    if isinstance(split, TaskSplit):  # a generation task's targets are text too (BBC headlines)
        return split.texts_a + (split.texts_b or []) + [t for t in split.labels if isinstance(t, str)]
    if split and isinstance(split[0], TaggedSentence):
        return [" ".join(sentence.tokens) for sentence in split]
    return list(dict.fromkeys(text for example in split for text in (example.context, example.question)))


def evaluation_files(task: DictConfig) -> dict[str, str]:
    """Split name -> file of the splits a task is scored on: its dev split, and its test split where its YAML names
    one (`test_file`; scored by nobody here, but a test set is only one while no model has read it)."""
    return {"dev": task.dev_file, **({"test": task.test_file} if task.get("test_file") else {})}


def evaluation_texts(task: DictConfig, data_dir: Path) -> dict[str, list[str]]:
    """Split name -> the texts of each split in `evaluation_files`: what pretraining must not read
    (data.decontaminate)."""
    return {split: _texts(SPLIT_READERS[task.format](task, data_dir, name))
            for split, name in evaluation_files(task).items()}


def read_task_files(task: DictConfig, data_dir: Path, allow_outside: bool = False) -> None:
    """Every split of a task read as fine-tuning (and decontamination) reads it: raises on the first bad row, naming
    its file and line, on a file outside `data_dir` unless `allow_outside` (task_files), and on a classification train
    split of one label; warns of what would cap or skew the scores without failing (dev labels that train never has,
    empty generation targets)."""
    if task.format not in SPLIT_READERS:
        raise ValueError(f"task {task.name}: unknown format {task.format!r}; use one of {list(SPLIT_READERS)}")
    paths = task_files(task, data_dir, allow_outside)
    splits = {key: SPLIT_READERS[task.format](task, data_dir, task[key]) for key in paths}
    if task.format == "tsv" and task.labels is not None:
        check_labels_across_splits(task, {paths[key]: split.labels for key, split in splits.items()},
                                   paths["train_file"])
    if task.format == "seq2seq":
        for key, split in splits.items():
            warn_of_empty_targets(task, paths[key], split)
    if task.format in ("tsv", "seq2seq"):
        warn_of_examples_also_in_train(paths, splits)


def check_labels_across_splits(task: DictConfig, labels: dict[Path, list[int]], train_path: Path) -> None:
    """A train split of a single label teaches nothing to tell apart, and the baselines' logistic regression refuses
    it only once every model has been fine-tuned: refused here. A label of an evaluation split that train never has
    cannot be predicted, so it caps the score: warned of, with how many examples carry it."""
    names = list(task.labels)
    seen = Counter(labels[train_path])
    if len(seen) < 2:
        (only,) = seen
        raise ValueError(f"{train_path}: every one of its {seen[only]} examples has label {names[only]!r}; task "
                         f"{task.name} needs at least two of its labels {names} in the train split to learn to tell "
                         "them apart: add examples of another label")
    for path, split_labels in labels.items():
        unseen = Counter(label for label in split_labels if label not in seen)
        if path == train_path or not unseen:
            continue
        count = sum(unseen.values())
        listed = ", ".join(f"{names[label]!r} ({n})" for label, n in unseen.most_common())
        print(f"WARNING: {path}: {count} of its {len(split_labels)} examples ({count / len(split_labels):.0%}) have "
              f"a label that {train_path.name} never has: {listed}; no model learns to predict it, so accuracy there "
              f"is at most {1 - count / len(split_labels):.2f}", flush=True)


def warn_of_empty_targets(task: DictConfig, path: Path, split: TaskSplit) -> None:
    """A generation task's row with an empty target trains the model to write nothing, and scores 0 on dev."""
    empty = sum(1 for target in split.labels if not target.strip())
    if empty:
        print(f"WARNING: {path}: {empty} of its {len(split.labels)} examples have an empty target (column "
              f"{task.label!r}) and task {task.name} generates targets; fill them in, or remove the rows", flush=True)


def _example_texts(split: TaskSplit) -> list[tuple[str, str | None]]:
    return list(zip(split.texts_a, split.texts_b or [None] * len(split.texts_a)))


def warn_of_examples_also_in_train(paths: dict[str, Path], splits: dict[str, TaskSplit]) -> None:
    """An evaluation example whose text is also a training example's scores what the model memorised, not what it
    learnt (a dev file that is a copy of train, rows pasted into both). `paths` and `splits` by the YAML's key."""
    trained = set(_example_texts(splits["train_file"]))
    for key, split in splits.items():
        repeated = sum(1 for example in _example_texts(split) if example in trained)
        if key != "train_file" and repeated:
            share = repeated / len(split.labels)
            print(f"WARNING: {paths[key]}: {repeated} of its {len(split.labels)} examples ({share:.0%}) have the text "
                  f"of an example of {paths['train_file'].name}; a score there is partly recall of training "
                  "examples: remove them from one of the files", flush=True)
