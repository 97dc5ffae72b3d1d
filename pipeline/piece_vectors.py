"""Piece vectors: word2vec (the `word2vec` block's settings) over the corpus written in a model's own pieces, one
vector of the model's width per piece, what pretrain.init_embeddings=word2vec starts its token embeddings from. One
stage function for every tokenizer (BERT's WordPiece, GPT's byte-level BPE: `bert_piece_vectors`,
`gpt_piece_vectors`); skip-gram's ~10^4 FLOPs per token place the pieces by their contexts in a fraction of the time
a Transformer's objective needs per token (docs/pretraining_recipes.md). Nothing here imports torch: the stage runs
with the data stages (tests/run/test_layering.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
from omegaconf import DictConfig
from tokenizers import Tokenizer

from data_prep.corpus.shards import shard_paths
from pipeline.downstream.word2vec import Word2VecConfig, train_word2vec
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import typed_settings

PIECE_VECTORS_FILE = "vectors.npy"


@dataclass(frozen=True)
class PieceVectorStart:
    """Where pretraining with pretrain.init_embeddings=word2vec starts, before its first step: the model's
    architecture (`config`, its family's config dataclass), freshly initialised, its token embeddings set to a
    piece-vector stage's `vectors` (pipeline.engine.pretraining.start_word_embeddings). A control kind fine-tunes from
    there."""
    config: object
    vectors: np.ndarray


def piece_vectors(ctx: StageContext, tokenizer_stage: str, load_tokenizer: Callable[[Path], Tokenizer],
                  encode: Callable[[Tokenizer, pa.Array], list[list[int]]],
                  width: Callable[[DictConfig, int], int]) -> dict:
    """Skip-gram vectors of the pieces of the tokenizer that `tokenizer_stage` wrote (read by `load_tokenizer`), the
    corpus's sentences written as ids by `encode` (a shard's texts -> their ids), `width(cfg, vocab_size)` dimensions,
    saved in id order as `vectors.npy` (NaN rows: pieces the corpus never shows)."""
    started = time.perf_counter()
    tok = load_tokenizer(ctx.stage_dir(tokenizer_stage))
    vector_size = width(ctx.cfg, tok.get_vocab_size())
    with ctx.scratch_dir() as scratch:
        corpus = scratch / "pieces.txt"
        with open(corpus, "w") as f:
            for shard in shard_paths(ctx.stage_dir("prepare")):
                for ids in encode(tok, read_arrow(shard).column("text").combine_chunks()):
                    f.write(" ".join(map(str, ids)) + "\n")
        # every piece the corpus shows: the tokenizer kept only pieces frequent enough to be learned
        vectors = train_word2vec(corpus, typed_settings(ctx.cfg.word2vec, Word2VecConfig), ctx.cfg.seed,
                                 vector_size=vector_size, min_count=1)
    table = np.full((tok.get_vocab_size(), vector_size), np.nan, dtype=np.float32)
    table[[int(w) for w in vectors.words]] = vectors.vectors
    np.save(ctx.out_dir / PIECE_VECTORS_FILE, table)
    return {"pieces_with_vectors": len(vectors.words), "vocab_size": tok.get_vocab_size(),
            "vector_size": vector_size, "seconds": round(time.perf_counter() - started, 1)}


def read_piece_vectors(stage_dir: Path) -> np.ndarray:
    """A piece-vector stage's table (`stage_dir`: its output): one row per token id, NaN for a piece the corpus never
    shows."""
    return np.load(stage_dir / PIECE_VECTORS_FILE)
