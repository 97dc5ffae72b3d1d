"""ELMo's data stages: a word vocabulary counted per shard and per-book token streams, one Ray task per shard.
Nothing here imports torch: the Ray workers these stages run in stay at the size of the data they hold
(pipeline/elmo/pretrain.py lists the stages)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from data_prep.corpus.shards import shard_paths
from data_prep.corpus.tokenizer import unknown_rate_summary, unknown_words
from data_prep.examples.elmo_examples import (
    books_from_rows,
    count_words,
    vocab_from_counts,
    write_token_streams,
    write_word_vocab,
)
from pipeline.corpus import count_over_shards, require_books
from pipeline.data_settings import chinese_words_of
from pipeline.elmo.settings import ElmoConfig
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import typed_settings


def elmo_vocab(ctx: StageContext) -> dict:
    # One counting task per shard: counted in the stage's own process, this was the slowest data stage at 1 GB (335 s,
    # where the per-shard Skip-Thought vocabulary took 74 s) and the one that no number of workers would speed up
    # (docs/scaling.md)
    settings = typed_settings(ctx.cfg.elmo, ElmoConfig)
    counts = count_over_shards(ctx, partial(count_words, chinese_words=chinese_words_of(ctx.cfg)))
    vocab = vocab_from_counts(counts, settings.vocab_size, settings.min_count)
    write_word_vocab(vocab, ctx.out_dir / "vocab.txt")
    return {"vocab_size": len(vocab),
            **unknown_rate_summary(*unknown_words(counts, vocab), "elmo.vocab_size", unit="words")}


def build_shard_streams(index: int, shard_path: Path, out_dir: Path, chinese_words: str) -> int:
    table = read_arrow(shard_path)
    return write_token_streams(books_from_rows(table.column("book_id").to_pylist(), table.column("text").to_pylist(),
                                               chinese_words),
                               out_dir / f"streams-{index:05d}.arrow")


def elmo_streams(ctx: StageContext) -> dict:
    require_books(ctx.stage_dir("prepare"), 2, "ELMo's held-out perplexity is measured on whole books set aside "
                  "from training")
    shards = shard_paths(ctx.stage_dir("prepare"))
    books = ctx.map_shards(build_shard_streams, shards, ctx.out_dir,
                           chinese_words_of(ctx.cfg))
    return {"books": int(sum(books)), "files": len(shards)}
