"""ELMo's stages (Peters et al. 2018): a word vocabulary and per-book token streams built from the sentence shards,
then biLM pretraining with truncated BPTT over whole books (pipeline/elmo/module.py explains why windows, not
sentence batches). The frozen biLM then serves the evaluate stage as a sentence encoder."""
from __future__ import annotations

from pathlib import Path

import hydra
import lightning as L
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from data_prep.elmo_examples import (
    books_from_rows,
    build_word_vocab,
    read_word_vocab,
    write_token_streams,
    write_word_vocab,
)
from data_prep.shards import open_shards, shard_paths
from models.elmo import save_pretrained
from pipeline.elmo.module import ElmoPretrainModule, build_elmo_datasets
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext, all_cpus
from pipeline.engine.shard_tasks import map_shards
from pipeline.engine.tracking import LossHistory
from pipeline.engine.training import make_trainer


def elmo_vocab(ctx: StageContext) -> dict:
    table = open_shards(ctx.stage_dir("prepare"))
    texts = (t for batch in table.to_batches() for t in batch.column("text").to_pylist())
    vocab = build_word_vocab(texts, ctx.cfg.elmo.vocab_size, ctx.cfg.elmo.min_count)
    write_word_vocab(vocab, ctx.out_dir / "vocab.txt")
    return {"vocab_size": len(vocab)}


def build_shard_streams(index: int, shard_path: Path, out_dir: Path) -> int:
    table = read_arrow(shard_path)
    return write_token_streams(books_from_rows(table.column("book_id").to_pylist(), table.column("text").to_pylist()),
                               out_dir / f"streams-{index:05d}.arrow")


def elmo_streams(ctx: StageContext) -> dict:
    shards = shard_paths(ctx.stage_dir("prepare"))
    books = map_shards(build_shard_streams, shards, ctx.out_dir)
    return {"books": int(sum(books)), "files": len(shards)}


def elmo_pretrain(ctx: StageContext) -> dict:
    cfg, e, p = ctx.cfg, ctx.cfg.elmo, ctx.cfg.pretrain
    vocab = read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt")
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["config"]["vocab_size"] = len(vocab)
    L.seed_everything(cfg.seed, workers=True)
    model = hydra.utils.instantiate(model_cfg, _convert_="all")
    train, heldout = build_elmo_datasets(sorted(ctx.stage_dir("elmo_streams").glob("streams-*.arrow")), vocab,
                                         e.window, e.batch_size, e.holdout_books_fraction, cfg.seed,
                                         char_inputs=model.config.token_encoder == "char_cnn")
    module = ElmoPretrainModule(model, lr=p.lr, warmup_steps=p.warmup_steps, max_steps=p.max_steps,
                                weight_decay=p.weight_decay)
    history = LossHistory()
    trainer = make_trainer(ctx, [history], max_steps=p.max_steps, gradient_clip_val=p.grad_clip,
                           val_check_interval=min(p.val_every_steps, p.max_steps), check_val_every_n_epoch=None,
                           num_sanity_val_steps=0, enable_checkpointing=False)
    # batch_size=None and no shuffling: each batch row continues the book the previous batch's row was reading.
    trainer.fit(module, DataLoader(train, batch_size=None), DataLoader(heldout, batch_size=None))
    save_pretrained(model, ctx.out_dir / "bilm")
    history.write_csv(ctx.out_dir / "loss_curve.csv")
    return {"steps": trainer.global_step, "heldout_perplexity": module.heldout_perplexities,
            "precision": trainer.precision, "num_parameters": sum(t.numel() for t in model.parameters())}



ELMO_STAGES = [
    Stage("elmo_vocab", elmo_vocab, ("prepare",), ("elmo.vocab_size", "elmo.min_count")),
    Stage("elmo_streams", elmo_streams, ("prepare",), ()),
    Stage("elmo_pretrain", elmo_pretrain, ("elmo_vocab", "elmo_streams"),
          ("model", "elmo", "pretrain", "trainer", "seed"), num_cpus=all_cpus),
]
