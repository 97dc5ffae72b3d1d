"""The pipeline's stages and their DAG; each writes into its own content-addressed directory (pipeline/dag.py),
linked from the run directory as `<run_dir>/<stage>`.

Data functions stay pure (data_prep/); this module maps them over shards with Ray and wires Lightning at the edge."""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import lightning as L
import numpy as np
import ray
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from data_prep.bert_examples import create_training_instances, write_instances
from data_prep.builtin import default_corpus
from data_prep.prepare import prepare_corpus
from data_prep.shards import open_shards, shard_paths
from data_prep.tokenizer import encode_batch_ids, load_tokenizer, train_wordpiece
from models.bert import BertForSequenceClassification, load_encoder
from pipeline.dag import Stage, StageContext
from pipeline.data import EncodedTask, pad_classification_batch, read_arrow
from pipeline.lit import SequenceClassificationModule
from pipeline.pretraining import pretrain
from pipeline.report import write_report
from pipeline.tasks import load_task, read_split, resolve_task_dir
from pipeline.training import make_trainer


def corpus_dir(cfg: DictConfig) -> Path:
    """The configured corpus, or the built-in one (downloaded on first use)."""
    return Path(cfg.data.corpus_dir).expanduser() if cfg.data.corpus_dir else default_corpus(cfg.paths.cache_dir)


def prepare(ctx: StageContext) -> dict:
    data = ctx.cfg.data
    corpus = corpus_dir(ctx.cfg)
    manifest = prepare_corpus(corpus, ctx.stage_dir("prepare"), glob=data.glob, input_format=data.input_format,
                              shard_bytes=int(data.shard_bytes), min_tokens=data.min_tokens,
                              max_tokens=data.max_tokens, nfkc=data.nfkc, num_workers=ctx.cfg.ray.num_cpus)
    return {"corpus_dir": str(corpus), **manifest["totals"]}


def tokenizer(ctx: StageContext) -> dict:
    table = open_shards(ctx.stage_dir("prepare"))
    # Record batches stream from the memory map: the trainer never holds the corpus as Python strings.
    sentences = (text for batch in table.to_batches() for text in batch.column("text").to_pylist())
    tok_cfg = ctx.cfg.tokenizer
    trained = train_wordpiece(sentences, ctx.stage_dir("tokenizer"), vocab_size=tok_cfg.vocab_size,
                              min_frequency=tok_cfg.min_frequency, lowercase=tok_cfg.lowercase)
    return {"vocab_size": trained.get_vocab_size()}


def _tokenized_books(shard_path: str, tok) -> list[list[list[int]]]:
    """The books of one sentence shard as lists of sentences of token ids, in shard order."""
    table = read_arrow(shard_path)
    ids = encode_batch_ids(tok, table.column("text").to_pylist())
    books, current = [], None
    for book_id, sentence_ids in zip(table.column("book_id").to_pylist(), ids):
        if book_id != current:
            books.append([])
            current = book_id
        books[-1].append(sentence_ids)
    return books


@ray.remote(num_cpus=1)
def build_shard_examples(shard_path: str, neighbour_path: str, tokenizer_dir: str, out_path: str,
                         max_seq_length: int, short_seq_prob: float, dupe_factor: int, seed: int) -> int:
    """Tokenize one sentence shard and write its BERT sentence-pair instances.

    Random next sentences come from the shard's other books; a shard holding a single (long) book borrows the
    books of its neighbour shard for that, and only for that."""
    tok = load_tokenizer(tokenizer_dir)
    books = _tokenized_books(shard_path, tok)
    borrowed = _tokenized_books(neighbour_path, tok) if len(books) < 2 and neighbour_path != shard_path else []
    instances = create_training_instances(books, max_seq_length, short_seq_prob, dupe_factor,
                                          random.Random(seed), random_next_documents=borrowed)
    write_instances(instances, out_path, tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"))
    return len(instances)


def examples(ctx: StageContext) -> dict:
    shards = shard_paths(ctx.stage_dir("prepare"))
    out = ctx.stage_dir("examples")
    ex = ctx.cfg.examples
    # One seed per shard, derived from the run seed: the output does not depend on which worker ran what.
    refs = [build_shard_examples.remote(str(shard), str(shards[(i + 1) % len(shards)]), str(ctx.stage_dir("tokenizer")),
                                        str(out / f"examples-{i:05d}.arrow"), ex.max_seq_length,
                                        ex.short_seq_prob, ex.dupe_factor, ctx.cfg.seed * 1000 + i)
            for i, shard in enumerate(shards)]
    counts = ray.get(refs)
    return {"instances": int(sum(counts)), "files": len(counts)}


def _finetune_one(ctx: StageContext, kind: str, encoder_dir: Path, train_set, dev_set, num_labels: int) -> float:
    f = ctx.cfg.finetune
    L.seed_everything(ctx.cfg.seed, workers=True)  # same head init and data order for every kind
    encoder = load_encoder(encoder_dir)
    model = BertForSequenceClassification(encoder.config, num_labels)
    if kind == "pretrained":
        model.bert.load_state_dict(encoder.state_dict())
    elif kind != "random_init":
        raise ValueError(f"finetune.models: unknown kind {kind!r}; use pretrained and/or random_init")
    train_loader = DataLoader(train_set, batch_size=f.batch_size, shuffle=True,
                              collate_fn=pad_classification_batch,
                              generator=torch.Generator().manual_seed(ctx.cfg.seed))
    dev_loader = DataLoader(dev_set, batch_size=128, collate_fn=pad_classification_batch)
    total_steps = len(train_loader) * f.epochs
    module = SequenceClassificationModule(model, lr=f.lr, weight_decay=f.weight_decay,
                                          warmup_steps=int(f.warmup_fraction * total_steps),
                                          total_steps=total_steps)
    trainer = make_trainer(ctx, [], prefix=kind, max_epochs=f.epochs, num_sanity_val_steps=0,
                       enable_checkpointing=False)
    trainer.fit(module, train_loader, dev_loader)
    return module.accuracy


def finetune(ctx: StageContext) -> dict:
    f = ctx.cfg.finetune
    task = load_task(f.task)
    data_dir = resolve_task_dir(task, f.data_dir, ctx.cfg.paths.cache_dir)
    train, dev = read_split(task, data_dir / task.train_file), read_split(task, data_dir / task.dev_file)
    if f.max_train_examples and len(train.labels) > f.max_train_examples:
        keep = sorted(random.Random(ctx.cfg.seed).sample(range(len(train.labels)), f.max_train_examples))
        train.texts_a = [train.texts_a[i] for i in keep]
        train.texts_b = [train.texts_b[i] for i in keep] if train.texts_b is not None else None
        train.labels = [train.labels[i] for i in keep]
    tok = load_tokenizer(ctx.stage_dir("tokenizer"))
    train_set = EncodedTask(tok, train.texts_a, train.texts_b, train.labels, f.max_seq_length)
    dev_set = EncodedTask(tok, dev.texts_a, dev.texts_b, dev.labels, f.max_seq_length)
    rows = []
    for kind in f.models:
        started = time.perf_counter()
        score = _finetune_one(ctx, kind, ctx.stage_dir("pretrain") / "encoder", train_set, dev_set,
                              len(task.labels))
        rows.append({"model": kind, "task": task.name, "metric": task.metric, "score": round(score, 4),
                     "train_examples": len(train_set), "dev_examples": len(dev_set),
                     "seconds": round(time.perf_counter() - started, 1)})
        print(f"finetune {task.name}: {kind} dev {task.metric} = {score:.4f}")
    majority = max(np.bincount(dev.labels)) / len(dev.labels)
    rows.append({"model": "majority_class", "task": task.name, "metric": task.metric,
                 "score": round(float(majority), 4), "train_examples": len(train_set),
                 "dev_examples": len(dev_set), "seconds": 0.0})
    (ctx.stage_dir("finetune") / "results.json").write_text(json.dumps(rows, indent=2))
    return {"results": rows}


def report(ctx: StageContext) -> dict:
    paths = write_report({name: ctx.stage_dir(name) for name in ("pretrain", "finetune")}, ctx.out_dir,
                         title=ctx.cfg.experiment_name)
    return {k: str(v) for k, v in paths.items()}


def _files_fingerprint(root: Path, pattern: str) -> str:
    """Names, sizes and modification times of the input files: a changed corpus is new work."""
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    listing = [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps([str(root), listing]).encode()).hexdigest()


def _corpus_fingerprint(cfg: DictConfig) -> str:
    return _files_fingerprint(corpus_dir(cfg), cfg.data.glob)


def _task_fingerprint(cfg: DictConfig) -> str:
    task = load_task(cfg.finetune.task)
    return _files_fingerprint(resolve_task_dir(task, cfg.finetune.data_dir, cfg.paths.cache_dir), "*")


def _all_cpus(cfg: DictConfig) -> float:
    return float(cfg.ray.num_cpus)


# The DAG, declared once: (name, function, upstream stages, config keys that decide the output, code version).
STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("prepare", prepare, (), ("data",), version=1, fingerprint=_corpus_fingerprint),
    Stage("tokenizer", tokenizer, ("prepare",), ("tokenizer",), version=1),
    Stage("examples", examples, ("prepare", "tokenizer"), ("examples", "seed"), version=1),
    Stage("pretrain", pretrain, ("tokenizer", "examples"), ("model", "pretrain", "trainer", "seed"), version=1,
          num_cpus=_all_cpus),
    Stage("finetune", finetune, ("tokenizer", "pretrain"), ("finetune", "trainer", "seed"), version=1,
          fingerprint=_task_fingerprint, num_cpus=_all_cpus),
    Stage("report", report, ("pretrain", "finetune"), ("experiment_name",), version=1),
]}
