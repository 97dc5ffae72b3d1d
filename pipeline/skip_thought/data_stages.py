"""Skip-Thought's data stages: a word vocabulary counted over the sentence shards, then (previous, current, next)
triples that never cross a book, one Ray task per shard. Nothing here imports torch: the Ray workers these stages run
in stay at the size of the data they hold (pipeline/skip_thought/pretrain.py lists the stages)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from data_prep.corpus.shards import shard_paths
from data_prep.corpus.tokenizer import unknown_rate_summary, unknown_words
from data_prep.examples.skip_thought_examples import (
    WordVocab,
    build_word_vocab,
    count_words,
    triples_from_shard,
    write_triples,
)
from pipeline.corpus import count_over_shards
from pipeline.data_settings import chinese_words_of
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import typed_settings
from pipeline.skip_thought.settings import SkipThoughtConfig


def skip_thought_vocab(ctx: StageContext) -> dict:
    chinese_words = chinese_words_of(ctx.cfg)
    settings = typed_settings(ctx.cfg.skip_thought, SkipThoughtConfig)
    counts = count_over_shards(ctx, partial(count_words, chinese_words=chinese_words))
    vocab = build_word_vocab(counts, settings.vocab_size, settings.min_count, chinese_words)
    vocab.save(ctx.out_dir / "vocab.txt")
    return {"vocab_size": len(vocab), "distinct_words": len(counts),
            **unknown_rate_summary(*unknown_words(counts, vocab.words), "skip_thought.vocab_size", unit="words")}


def build_shard_triples(index: int, shard_path: Path, vocab_path: Path, out_dir: Path, max_words: int,
                        chinese_words: str) -> int:
    triples = triples_from_shard(read_arrow(shard_path), WordVocab.load(vocab_path, chinese_words), max_words)
    write_triples(triples, out_dir / f"triples-{index:05d}.arrow")
    return len(triples)


def skip_thought_examples(ctx: StageContext) -> dict:
    counts = ctx.map_shards(build_shard_triples, shard_paths(ctx.stage_dir("prepare")),
                            ctx.stage_dir("skip_thought_vocab") / "vocab.txt", ctx.out_dir,
                            typed_settings(ctx.cfg.skip_thought, SkipThoughtConfig).max_words,
                            chinese_words_of(ctx.cfg))
    return {"triples": int(sum(counts)), "files": len(counts)}
