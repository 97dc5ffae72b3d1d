"""GPT's data stages: a byte-level BPE trained on the sentence shards, then the books of each shard packed into
fixed-length blocks (data_prep/examples/gpt_blocks.py), one Ray task per shard, and what its piece vectors need
(pipeline/piece_vectors.py). Nothing here imports torch: the Ray workers these stages run in stay at the size of the
data they hold (pipeline/gpt/pretrain.py lists the stages)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from data_prep.corpus.shards import sampled_texts, shard_paths
from data_prep.corpus.tokenize_shards import use_one_tokenizer_thread
from data_prep.corpus.tokenizer import UNKNOWN_RATE_SENTENCES, encode_batch_ids, unknown_rate_summary, unknown_tokens
from data_prep.examples.gpt_blocks import load_gpt_tokenizer, shard_blocks, train_byte_level_bpe, write_blocks
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import model_key, typed_settings
from pipeline.gpt.settings import GptDataConfig
from pipeline.piece_vectors import piece_vectors


def gpt_tokenizer(ctx: StageContext) -> dict:
    g = typed_settings(ctx.cfg.gpt, GptDataConfig)
    num_sentences, texts = sampled_texts(ctx.stage_dir("prepare"), g.max_sentences)
    tok = train_byte_level_bpe(texts, ctx.out_dir, g.vocab_size, g.min_frequency)
    _, sample = sampled_texts(ctx.stage_dir("prepare"), UNKNOWN_RATE_SENTENCES)
    return {"vocab_size": tok.get_vocab_size(), "sentences": num_sentences,
            **unknown_rate_summary(*unknown_tokens(tok, sample), "gpt.vocab_size")}


def build_shard_blocks(index: int, shard_and_next: tuple[Path, Path | None], tokenizer_dir: Path, out_dir: Path,
                       block_size: int) -> int:
    use_one_tokenizer_thread()
    shard_path, next_shard = shard_and_next
    table = read_arrow(shard_path)
    next_first_book = read_arrow(next_shard).column("book_id")[0].as_py() if next_shard else None
    blocks = shard_blocks(table.column("book_id").to_pylist(), table.column("text").to_pylist(),
                          load_gpt_tokenizer(tokenizer_dir), block_size, next_first_book)
    write_blocks(blocks, out_dir / f"blocks-{index:05d}.arrow")
    return len(blocks)


def gpt_blocks(ctx: StageContext) -> dict:
    block_size = typed_settings(ctx.cfg.gpt, GptDataConfig).block_size
    shards = shard_paths(ctx.stage_dir("prepare"))
    counts = ctx.map_shards(build_shard_blocks, list(zip(shards, [*shards[1:], None])),
                            ctx.stage_dir("gpt_tokenizer"), ctx.out_dir, block_size)
    return {"blocks": int(sum(counts)), "files": len(counts), "block_size": block_size}


def embedding_width(cfg: DictConfig, vocab_size: int) -> int:
    """The width of the token embeddings of the GPT that the run builds (gpt.model where it has one, else `model`):
    what its piece vectors are trained at."""
    return instantiate(OmegaConf.select(cfg, model_key(cfg, "gpt")).config, vocab_size=vocab_size,
                       eos_token_id=None).n_embd


def byte_level_ids(tok: Tokenizer, texts: pa.Array) -> list[list[int]]:
    """Each sentence's byte-level BPE ids as fine-tuning encodes a task's text: alone, so its first word comes without
    the leading space it has inside a book, and both forms of a word get a vector."""
    return encode_batch_ids(tok, texts.to_pylist())


def gpt_piece_vectors(ctx: StageContext) -> dict:
    """The shared piece-vector stage (pipeline/piece_vectors.py) over the byte-level BPE pieces, each sentence encoded
    alone (byte_level_ids), at the width of GPT's token embeddings."""
    return piece_vectors(ctx, tokenizer_stage="gpt_tokenizer", load_tokenizer=load_gpt_tokenizer,
                         encode=byte_level_ids, width=embedding_width)
