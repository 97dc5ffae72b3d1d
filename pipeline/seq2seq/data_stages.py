"""The seq2seq family's data stages: a byte-level BPE with the family's special tokens (GPT's tokenizer function,
data_prep/examples/gpt_blocks.py), then each shard's books cut into blocks of whole sentences and corrupted into
source/target pairs (data_prep/examples/seq2seq_examples.py), one Ray task per shard, and the pieces' skip-gram
vectors that pretrain.init_embeddings=word2vec starts the shared embeddings from (pipeline/piece_vectors.py). Nothing
here imports torch (pipeline/gpt/data_stages.py says why)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from hydra.utils import instantiate
from omegaconf import DictConfig
from tokenizers import Tokenizer

from data_prep.corpus.shards import sampled_texts, shard_paths
from data_prep.corpus.tokenize_shards import use_one_tokenizer_thread
from data_prep.corpus.tokenizer import UNKNOWN_RATE_SENTENCES, encode_batch_ids, unknown_rate_summary, unknown_tokens
from data_prep.examples.gpt_blocks import train_byte_level_bpe
from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer, shard_examples, special_tokens, write_examples
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import typed_settings
from pipeline.piece_vectors import piece_vectors
from pipeline.seq2seq.settings import Seq2SeqBlockConfig


def seq2seq_tokenizer(ctx: StageContext) -> dict:
    s = typed_settings(ctx.cfg.seq2seq, Seq2SeqBlockConfig)
    num_sentences, texts = sampled_texts(ctx.stage_dir("prepare"), s.max_sentences)
    tok = train_byte_level_bpe(texts, ctx.out_dir, s.vocab_size, s.min_frequency, special_tokens(s.num_sentinels))
    _, sample = sampled_texts(ctx.stage_dir("prepare"), UNKNOWN_RATE_SENTENCES)
    return {"vocab_size": tok.get_vocab_size(), "sentences": num_sentences,
            **unknown_rate_summary(*unknown_tokens(tok, sample), "seq2seq.vocab_size")}


def build_shard_examples(index: int, shard_path: Path, tokenizer_dir: Path, out_dir: Path, block_size: int,
                         objective: str, seed: int) -> int:
    use_one_tokenizer_thread()
    table = read_arrow(shard_path)
    # seeded by the run's seed and the shard's index: the same pairs whichever worker builds them
    examples = shard_examples(table.column("book_id").to_pylist(), table.column("text").to_pylist(),
                              load_seq2seq_tokenizer(tokenizer_dir), block_size, objective,
                              np.random.default_rng([seed, index]))
    write_examples(examples, out_dir / f"examples-{index:05d}.arrow")
    return len(examples)


def seq2seq_examples(ctx: StageContext) -> dict:
    s = typed_settings(ctx.cfg.seq2seq, Seq2SeqBlockConfig)
    counts = ctx.map_shards(build_shard_examples, shard_paths(ctx.stage_dir("prepare")),
                            ctx.stage_dir("seq2seq_tokenizer"), ctx.out_dir, s.block_size, str(s.objective),
                            ctx.cfg.seed)
    return {"examples": int(sum(counts)), "files": len(counts), "block_size": s.block_size,
            "objective": str(s.objective)}


def embedding_width(cfg: DictConfig, vocab_size: int) -> int:
    """The width of the shared token embeddings of the encoder-decoder that the run's `model` builds: d_model for the
    Transformer, embedding_dim for the RNN. What its piece vectors are trained at."""
    config = instantiate(cfg.model.config, vocab_size=vocab_size)
    return config.d_model if hasattr(config, "d_model") else config.embedding_dim


def spaced_ids(tok: Tokenizer, texts: pa.Array) -> list[list[int]]:
    """Each sentence's byte-level BPE ids after a space: how pretraining reads every sentence of a book but its first,
    and how fine-tuning reads a task's sources and targets (pipeline/seq2seq/downstream.py encode_texts)."""
    return encode_batch_ids(tok, [" " + text for text in texts.to_pylist()])


def seq2seq_piece_vectors(ctx: StageContext) -> dict:
    """The shared piece-vector stage (pipeline/piece_vectors.py) over this family's byte-level BPE pieces, at the
    width of the encoder-decoder's shared embeddings."""
    return piece_vectors(ctx, tokenizer_stage="seq2seq_tokenizer", load_tokenizer=load_seq2seq_tokenizer,
                         encode=spaced_ids, width=embedding_width)
