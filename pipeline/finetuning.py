"""The fine-tune stage: every configured task × model × seed, BERT fine-tuned end to end (Devlin et al. 2019, §4;
seed 003), next to the same architecture from random initialisation and a majority-class baseline, and ELMo used
feature-based (Peters et al. 2018, §3.3: frozen biLM, trainable scalar mix, small task head).

One finished (task, model, seed) is one small JSON file, so a run killed half-way skips what it had finished."""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Subset

from data_prep.conll import TaggedSentence, encode_tagged_sentences, iob1_to_iob2, read_conll
from data_prep.elmo_examples import read_word_vocab
from data_prep.shards import write_json_atomically
from data_prep.squad import read_squad, squad_features
from data_prep.tokenizer import load_tokenizer
from models.bert import (BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                         load_encoder)
from models.elmo import ElmoEmbedder, ElmoSentenceClassifier, ElmoTokenTagger, load_bilm
from pipeline.dag import StageContext
from pipeline.data import EncodedTask, pad_classification_batch
from pipeline.lit_downstream import (ClassificationModule, QuestionAnsweringModule, RegressionModule,
                                     TokenClassificationModule, collate_question_answering,
                                     collate_token_classification)
from pipeline.lit_elmo import ElmoTaskModule, make_elmo_task_collate
from pipeline.metrics import score_task
from pipeline.pretraining import encoder_stage
from pipeline.tasks import TaskSplit, load_task, read_split, resolve_task_dir
from pipeline.training import make_trainer

# pretrained: this run's encoder (of its last BERT pretraining phase); random_init: the same architecture untrained;
# external: finetune.external_encoder;
# elmo: this run's ELMo biLM, frozen, with a trainable scalar mix and a BiLSTM head (feature-based, Peters et al. §3.3)
MODEL_KINDS = ("pretrained", "random_init", "external", "elmo")


def finetune_upstream(cfg: DictConfig) -> tuple[str, ...]:
    models = set(cfg.finetune.models)
    return ((("tokenizer", encoder_stage(cfg)) if {"pretrained", "random_init"} & models else ())
            + (("elmo_vocab", "elmo_pretrain") if "elmo" in models else ()))


@dataclass
class TaskData:
    """A task encoded once with one tokenizer, with what builds its model head and LightningModule."""
    train: list
    dev: list
    collate: Callable
    make_model: Callable       # BertConfig -> nn.Module with a `.bert` encoder (ELMo: None -> head on the biLM)
    make_module: Callable      # (model, lr=, weight_decay=, warmup_steps=, total_steps=) -> LightningModule
    majority_scores: dict[str, float] | None  # majority-class baseline, for classification tasks only
    train_labels: list | None = None  # class of each train example, for stratified subsets; None: not a class task


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


def train_sizes(cfg: DictConfig) -> list[int | None]:
    """finetune.train_sizes: labelled examples per fine-tuning run (None: all), in the order given."""
    sizes = list(cfg.finetune.get("train_sizes") or [None])
    bad = [s for s in sizes if s is not None and (not isinstance(s, int) or s < 1)]
    if bad:
        raise ValueError(f"finetune.train_sizes={sizes}: each must be a positive number of examples or null (all)")
    return sizes


def _subsample(items: list, limit: int | None, seed: int) -> list:
    if not limit or len(items) <= limit:
        return items
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), limit))]


def task_names(cfg: DictConfig) -> list[str]:
    task = cfg.finetune.task
    return [task] if isinstance(task, str) else list(task)


def split_off(train: TaskSplit, fraction: float, seed: int) -> tuple[TaskSplit, TaskSplit]:
    """(rest, held out): a random `fraction` of the train split held out to score on in its dev split's place, so
    that settings are chosen without reading the dev set they are reported on (finetune.selection_fraction)."""
    order = np.random.default_rng(seed).permutation(len(train.labels))
    cut = max(1, int(round(fraction * len(order))))

    def part(indices) -> TaskSplit:
        indices = sorted(indices.tolist())
        return TaskSplit([train.texts_a[i] for i in indices],
                         None if train.texts_b is None else [train.texts_b[i] for i in indices],
                         [train.labels[i] for i in indices])

    return part(order[cut:]), part(order[:cut])


def _tsv_splits(task: DictConfig, data_dir: Path, max_train_examples: int | None, seed: int,
                selection_fraction: float | None = None) -> tuple[TaskSplit, TaskSplit, dict[str, float] | None]:
    """A TSV task's train split (subsampled to `max_train_examples`) and dev split (a held-out part of train with
    `selection_fraction`), and the dev scores of always predicting the train split's most frequent label (None for a
    regression task)."""
    train, dev = read_split(task, data_dir / task.train_file), read_split(task, data_dir / task.dev_file)
    if selection_fraction:
        train, dev = split_off(train, selection_fraction, seed)
    keep = _subsample(list(range(len(train.labels))), max_train_examples, seed)
    train = TaskSplit([train.texts_a[i] for i in keep], None if train.texts_b is None else
                      [train.texts_b[i] for i in keep], [train.labels[i] for i in keep])
    if task.labels is None:
        return train, dev, None
    majority = int(np.bincount(train.labels).argmax())
    return train, dev, score_task(task.metric, [majority] * len(dev.labels), dev.labels)


def _conll_sentences(task: DictConfig, data_dir: Path, name: str) -> list[TaggedSentence]:
    """A CoNLL file's sentences with IOB2 tags: the files are IOB1, the task's labels IOB2."""
    return [TaggedSentence(s.tokens, iob1_to_iob2(s.tags)) for s in read_conll(data_dir / name, task.labels)]


def load_task_data(task: DictConfig, data_dir: Path, tok, max_seq_length: int, max_train_examples: int | None,
                   seed: int, selection_fraction: float | None = None, pooling: str = "cls") -> TaskData:
    """Read and encode one task, dispatching on its `format` (tsv | conll | squad) and label type; sentence
    (pair) tasks classify from `pooling` ("cls" or "mean", models.bert.BertForSequenceClassification)."""
    if task.format == "tsv":
        train, dev, majority_scores = _tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        sets = [EncodedTask(tok, s.texts_a, s.texts_b, s.labels, max_seq_length) for s in (train, dev)]
        if task.labels is None:  # regression (STS-B): one output, mean squared error
            return TaskData(*sets, pad_classification_batch,
                            lambda c: BertForSequenceClassification(c, 1, pooling=pooling),
                            RegressionModule, None)
        return TaskData(*sets, pad_classification_batch,
                        lambda c: BertForSequenceClassification(c, len(task.labels), pooling=pooling),
                        partial(ClassificationModule, metric=task.metric), majority_scores, train.labels)
    if task.format == "conll":
        train = _subsample(_conll_sentences(task, data_dir, task.train_file), max_train_examples, seed)
        dev, labels = _conll_sentences(task, data_dir, task.dev_file), list(task.labels)
        return TaskData(encode_tagged_sentences(tok, train, labels, max_seq_length),
                        encode_tagged_sentences(tok, dev, labels, max_seq_length), collate_token_classification,
                        lambda c: BertForTokenClassification(c, len(labels)),
                        partial(TokenClassificationModule, labels=labels, dev_tags=[s.tags for s in dev]), None)
    if task.format == "squad":
        train = _subsample(read_squad(data_dir / task.train_file), max_train_examples, seed)
        dev = read_squad(data_dir / task.dev_file)
        windows = dict(max_seq_length=max_seq_length, doc_stride=task.doc_stride,
                       max_query_length=task.max_query_length)
        dev_features = squad_features(tok, dev, **windows)
        return TaskData(list(enumerate(squad_features(tok, train, **windows))), list(enumerate(dev_features)),
                        collate_question_answering, BertForQuestionAnswering,
                        partial(QuestionAnsweringModule, dev_examples=dev, dev_features=dev_features,
                                n_best_size=task.n_best_size, max_answer_length=task.max_answer_length), None)
    raise ValueError(f"task {task.name}: unknown format {task.format!r}; use tsv, conll or squad")


def load_elmo_task_data(task: DictConfig, data_dir: Path, bilm_and_vocab: tuple, max_train_examples: int | None,
                        seed: int, selection_fraction: float | None = None) -> TaskData:
    """One task as rows of raw text (tsv) or of words (conll) for the frozen biLM; the heads of lit_elmo. The biLM
    is loaded once and shared by every seed: it is frozen, only the mix and the head are built fresh."""
    bilm, vocab = bilm_and_vocab
    collate = make_elmo_task_collate(ElmoEmbedder(bilm, vocab))
    if task.format == "tsv":
        train, dev, majority_scores = _tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        pair, regression = train.texts_b is not None, task.labels is None

        def rows(split: TaskSplit) -> list[dict]:
            return [{"text_a": split.texts_a[i], "label": split.labels[i],
                     **({"text_b": split.texts_b[i]} if pair else {})} for i in range(len(split.labels))]

        return TaskData(rows(train), rows(dev), collate,
                        lambda _: ElmoSentenceClassifier(bilm, 1 if regression else len(task.labels), pair=pair,
                                                         vocab=vocab),
                        partial(ElmoTaskModule, metric="pearson_spearman" if regression else task.metric),
                        majority_scores, None if regression else train.labels)
    if task.format == "conll":
        labels = list(task.labels)
        index = {tag: i for i, tag in enumerate(labels)}

        def rows(name: str) -> list[dict]:
            return [{"text_a": s.tokens, "label": [index[t] for t in s.tags]}
                    for s in _conll_sentences(task, data_dir, name)]

        return TaskData(_subsample(rows(task.train_file), max_train_examples, seed), rows(task.dev_file), collate,
                        lambda _: ElmoTokenTagger(bilm, len(labels), vocab=vocab),
                        partial(ElmoTaskModule, metric="entity_f1", labels=labels), None)
    raise ValueError(f"task {task.name}: ELMo's feature-based heads take tsv (classification, pairs, regression) "
                     f"and conll (tagging) tasks, not {task.format!r}; drop elmo from finetune.models for it")


def external_tokenizer(path: Path):
    """The tokenizer saved beside an external encoder (HF `tokenizer.json`, or a BERT `vocab.txt`)."""
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path / "tokenizer.json"))
    if (path / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        config = path / "tokenizer_config.json"
        lowercase = json.loads(config.read_text()).get("do_lower_case", True) if config.is_file() else True
        return BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=lowercase)
    raise FileNotFoundError(f"finetune.external_encoder={path} has no tokenizer.json or vocab.txt; put the "
                            "tokenizer files of that model beside its weights")


def model_sources(ctx: StageContext) -> dict[str, tuple[Path, object]]:
    """(encoder directory, tokenizer) of each model kind in finetune.models; for elmo, (biLM, its vocabulary)."""
    f = ctx.cfg.finetune
    unknown = [k for k in f.models if k not in MODEL_KINDS]
    if unknown:
        raise ValueError(f"finetune.models: unknown {unknown}; choose from {list(MODEL_KINDS)}")
    sources = {}
    if {"pretrained", "random_init"} & set(f.models):
        ours = (ctx.stage_dir(encoder_stage(ctx.cfg)) / "encoder", load_tokenizer(ctx.stage_dir("tokenizer")))
        sources.update({kind: ours for kind in ("pretrained", "random_init") if kind in f.models})
    if "elmo" in f.models:
        bilm = load_bilm(ctx.stage_dir("elmo_pretrain") / "bilm").eval()
        sources["elmo"] = (ctx.stage_dir("elmo_pretrain") / "bilm",
                           (bilm, read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt")))
    if "external" in f.models:
        if not f.external_encoder:
            raise ValueError("finetune.models has external but finetune.external_encoder is not set; pass the "
                             "directory of an HF BERT (config.json, weights and tokenizer files)")
        path = Path(f.external_encoder).expanduser()
        sources["external"] = (path, external_tokenizer(path))
    return sources


def finetune_once(ctx: StageContext, task: DictConfig, data: TaskData, encoder_dir: Path, kind: str,
                  seed: int, train_indices: np.ndarray) -> dict[str, float]:
    f = ctx.cfg.finetune
    L.seed_everything(seed, workers=True)  # the same head initialisation and data order for every model kind
    if kind == "elmo":
        model = data.make_model(None)  # the shared frozen biLM with a fresh mix and head
    else:
        encoder = load_encoder(encoder_dir)
        model = data.make_model(encoder.config)
        if kind != "random_init":
            model.bert.load_state_dict(encoder.state_dict())
    train_loader = DataLoader(Subset(data.train, train_indices.tolist()), batch_size=f.batch_size, shuffle=True,
                              collate_fn=data.collate, generator=torch.Generator().manual_seed(seed))
    dev_loader = DataLoader(data.dev, batch_size=f.eval_batch_size, collate_fn=data.collate)
    epochs = finetune_epochs(f.epochs, f.get("min_steps", 0), len(train_loader))
    total_steps = len(train_loader) * epochs
    module = data.make_module(model, lr=f.lr, weight_decay=f.weight_decay,
                              warmup_steps=int(f.warmup_fraction * total_steps), total_steps=total_steps)
    module.encoder_lr_factor = float(f.get("encoder_lr_factor", 1.0))
    trainer = make_trainer(ctx, [], prefix=f"{task.name}/{kind}/n{len(train_indices)}/seed{seed}",
                           max_epochs=epochs, num_sanity_val_steps=0, enable_checkpointing=False,
                           # dev is scored once, after the last epoch: no model is chosen by its dev score
                           check_val_every_n_epoch=epochs)
    trainer.fit(module, train_loader, dev_loader)
    return dict(module.scores)


def finetune_epochs(epochs: int, min_steps: int, steps_per_epoch: int) -> int:
    """finetune.epochs, raised until the run takes at least finetune.min_steps optimizer steps: a few hundred labelled
    examples give a handful of steps per epoch, too few to move a head, let alone an encoder (Mosbach et al. 2021,
    "On the Stability of Fine-tuning BERT", train small data sets for more iterations)."""
    return max(epochs, -(-min_steps // max(1, steps_per_epoch)))


def _aggregate(rows: list[dict]) -> list[dict]:
    """Mean ± std over seeds, one row per (model, task, metric, train size); `seeds` counts the seeds with a defined
    score."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["task"], row["metric"], row.get("train_size")), []).append(row)
    out = []
    for (model, task, metric, train_size), members in groups.items():
        every = np.array([m["score"] for m in members], dtype=float)
        # A correlation is undefined (NaN) when a model predicts a constant; such seeds are counted, not averaged.
        scores = every[~np.isnan(every)]
        out.append({"model": model, "task": task, "metric": metric,
                    "score": round(float(scores.mean()), 4) if len(scores) else float("nan"),
                    "std": round(float(scores.std(ddof=1)), 4) if len(scores) > 1 else 0.0,
                    "seeds": len(scores), "undefined_seeds": int(np.isnan(every).sum()),
                    "per_seed": [None if np.isnan(v) else round(float(v), 4) for v in every],
                    "train_size": train_size, "train_examples": members[0]["train_examples"],
                    "dev_examples": members[0]["dev_examples"], "scored_on": members[0].get("scored_on", "dev"),
                    "seconds": round(sum(m["seconds"] for m in members), 1)})
    return out


def finetune(ctx: StageContext) -> dict:
    f = ctx.cfg.finetune
    sources = model_sources(ctx)
    sizes = train_sizes(ctx.cfg)
    selection = f.get("selection_fraction")
    scored_on = "train_holdout" if selection else "dev"
    finished = ctx.out_dir / "finished"
    finished.mkdir(exist_ok=True)
    rows = []
    for name in task_names(ctx.cfg):
        task = load_task(name)
        if selection and task.format != "tsv":
            raise ValueError(f"finetune.selection_fraction holds out part of a TSV task's train split; task "
                             f"{task.name} is {task.format}: leave it null for this task")
        data_dir = resolve_task_dir(task, f.data_dir, ctx.cfg.paths.cache_dir)
        encoded: dict[int, TaskData] = {}  # per tokenizer: kinds sharing one encode the task once
        for kind in f.models:
            encoder_dir, tok = sources[kind]
            if id(tok) not in encoded:
                encoded[id(tok)] = (
                    load_elmo_task_data(task, data_dir, tok, f.max_train_examples, ctx.cfg.seed, selection)
                    if kind == "elmo" else load_task_data(task, data_dir, tok, f.max_seq_length,
                                                          f.max_train_examples, ctx.cfg.seed, selection,
                                                          f.get("pooling", "cls")))
            data = encoded[id(tok)]
            for size in sizes:
                for seed in f.seeds:
                    # The same examples for every model kind at a given size and seed: rows differ by the encoder only.
                    subset = stratified_subsample(data.train_labels, size, len(data.train),
                                                  np.random.default_rng([seed, size or 0]))
                    tag = f"{task.name}/{kind}/{'all' if size is None else size}/seed{seed}"
                    done = finished / (tag.replace("/", "-") + ".json")
                    if done.is_file():
                        print(f"finetune {tag}: found {done.name}, skipping")
                        rows += json.loads(done.read_text())
                        continue
                    started = time.perf_counter()
                    scores = finetune_once(ctx, task, data, encoder_dir, kind, seed, subset)
                    result = [{"model": kind, "task": task.name, "metric": metric, "score": value, "seed": seed,
                               "train_size": size, "train_examples": len(subset), "dev_examples": len(data.dev),
                               "scored_on": scored_on, "seconds": round(time.perf_counter() - started, 1)}
                              for metric, value in scores.items()]
                    write_json_atomically(done, result)
                    rows += result
                    print(f"finetune {tag}: " + ", ".join(f"{m} {v:.4f}" for m, v in scores.items()), flush=True)
        data = next(iter(encoded.values()))
        if data.majority_scores is not None:
            rows += [{"model": "majority_class", "task": task.name, "metric": metric, "score": value, "seed": None,
                      "train_size": None, "train_examples": len(data.train), "dev_examples": len(data.dev),
                      "scored_on": scored_on, "seconds": 0.0}
                     for metric, value in data.majority_scores.items()]
    results = _aggregate(rows)
    write_json_atomically(ctx.out_dir / "results.json", results)
    return {"results": headline_results(results)}


def _size_order(row: dict) -> float:
    return float("inf") if row.get("train_size") is None else row["train_size"]


def headline_results(results: list[dict]) -> list[dict]:
    """The rows of the largest training size (all data when finetune.train_sizes has null) of each model, task and
    metric: the results table; the smaller sizes are the label-efficiency curve."""
    best: dict[tuple, dict] = {}
    for row in results:
        key = (row["model"], row["task"], row["metric"])
        if key not in best or _size_order(row) > _size_order(best[key]):
            best[key] = row
    return list(best.values())


def label_efficiency(results: list[dict]) -> list[dict]:
    """The rows of a run with several training sizes (none when it had one), smallest size first."""
    sizes = {r.get("train_size") for r in results if r["model"] != "majority_class"}
    if len(sizes) < 2:
        return []
    return sorted((r for r in results if r["model"] != "majority_class"), key=_size_order)
