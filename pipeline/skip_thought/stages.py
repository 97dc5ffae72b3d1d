"""Skip-Thought's stages (Kiros et al. 2015): a word vocabulary counted over the sentence shards, (previous,
current, next) triples that never cross a book, then pretraining of the encoder and its two decoders. The trained
encoder serves the evaluate stage, optionally with its vocabulary expanded through GloVe (§2.2 of the paper)."""
from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import hydra
import lightning as L
from omegaconf import OmegaConf

from data_prep.shards import shard_paths
from data_prep.skip_thought_examples import (
    WordVocab,
    build_word_vocab,
    count_words,
    triples_from_shard,
    write_triples,
)
from models.skip_thought import save_pretrained
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext, all_cpus
from pipeline.engine.shard_tasks import map_shards
from pipeline.engine.tracking import LossHistory
from pipeline.engine.training import make_trainer
from pipeline.skip_thought.module import SkipThoughtPretrainModule, SkipThoughtTriples, triple_loaders


def count_shard_words(index: int, shard_path: Path) -> Counter:
    return count_words(read_arrow(shard_path).column("text").to_pylist())


def skip_thought_vocab(ctx: StageContext) -> dict:
    counts = sum(map_shards(count_shard_words, shard_paths(ctx.stage_dir("prepare"))), Counter())
    vocab = build_word_vocab(counts, ctx.cfg.skip_thought.vocab_size, ctx.cfg.skip_thought.min_count)
    vocab.save(ctx.out_dir / "vocab.txt")
    return {"vocab_size": len(vocab), "distinct_words": len(counts)}


def build_shard_triples(index: int, shard_path: Path, vocab_path: Path, out_dir: Path, max_words: int) -> int:
    triples = triples_from_shard(read_arrow(shard_path), WordVocab.load(vocab_path), max_words)
    write_triples(triples, out_dir / f"triples-{index:05d}.arrow")
    return len(triples)


def skip_thought_examples(ctx: StageContext) -> dict:
    counts = map_shards(build_shard_triples, shard_paths(ctx.stage_dir("prepare")),
                        ctx.stage_dir("skip_thought_vocab") / "vocab.txt", ctx.out_dir, ctx.cfg.skip_thought.max_words)
    return {"triples": int(sum(counts)), "files": len(counts)}


def skip_thought_pretrain(ctx: StageContext) -> dict:
    cfg, p = ctx.cfg, ctx.cfg.pretrain
    vocab_path = ctx.stage_dir("skip_thought_vocab") / "vocab.txt"
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["config"]["vocab_size"] = len(WordVocab.load(vocab_path))
    L.seed_everything(cfg.seed, workers=True)
    model = hydra.utils.instantiate(model_cfg, _convert_="all")
    tables = [read_arrow(f) for f in sorted(ctx.stage_dir("skip_thought_examples").glob("triples-*.arrow"))]
    train_loader, val_loader = triple_loaders(SkipThoughtTriples(tables), p.batch_size, p.val_fraction, cfg.seed,
                                              p.num_workers)
    module = SkipThoughtPretrainModule(model, lr=p.lr, weight_decay=p.weight_decay, betas=tuple(p.betas),
                                       warmup_steps=p.warmup_steps, max_steps=p.max_steps)
    history = LossHistory()
    trainer = make_trainer(ctx, [history], max_steps=p.max_steps, gradient_clip_val=p.grad_clip,
                           val_check_interval=min(p.val_every_steps, len(train_loader), p.max_steps),
                           check_val_every_n_epoch=None, num_sanity_val_steps=0, enable_checkpointing=False)
    started = time.perf_counter()
    trainer.fit(module, train_loader, val_loader)
    seconds = time.perf_counter() - started
    save_pretrained(model, ctx.out_dir / "model")
    shutil.copy(vocab_path, ctx.out_dir / "model" / "vocab.txt")
    history.write_csv(ctx.out_dir / "loss_curve.csv")
    return {"steps": trainer.global_step, "seconds": round(seconds, 1),
            "triples_per_s": round(trainer.global_step * p.batch_size / seconds, 1),
            "final_val_loss": history.last("val/loss"), "precision": trainer.precision,
            "num_parameters": sum(t.numel() for t in model.parameters())}



SKIP_THOUGHT_STAGES = [
    Stage("skip_thought_vocab", skip_thought_vocab, ("prepare",),
          ("skip_thought.vocab_size", "skip_thought.min_count")),
    Stage("skip_thought_examples", skip_thought_examples, ("prepare", "skip_thought_vocab"),
          ("skip_thought.max_words",)),
    Stage("skip_thought_pretrain", skip_thought_pretrain, ("skip_thought_vocab", "skip_thought_examples"),
          ("model", "pretrain", "trainer", "seed"), num_cpus=all_cpus),
]
