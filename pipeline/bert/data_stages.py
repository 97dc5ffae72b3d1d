"""BERT's data stages: a WordPiece vocabulary trained on the sentence shards, then sentence-pair instances per
shard (google-research/bert's create_pretraining_data), one Ray task per shard, and task-adaptive pretraining's
instances from the fine-tuning task's train texts. Nothing here imports torch: the Ray
workers these stages run in stay at the size of the data they hold (pipeline/bert/pretrain.py lists the stages)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from data_prep.corpus.shards import sampled_texts, shard_paths
from data_prep.corpus.tokenize_shards import encode_by_word, use_one_tokenizer_thread
from data_prep.corpus.tokenizer import (
    UNKNOWN_RATE_SENTENCES,
    WORDPIECE_UNKNOWN_RATE_WARNING,
    checkpoint_tokenizer,
    load_tokenizer,
    save_hf_tokenizer,
    train_wordpiece,
    unknown_rate_summary,
    unknown_tokens,
)
from data_prep.examples.bert_examples import create_training_instances, write_instances
from pipeline.bert.settings import BertPretrainConfig, ExamplesConfig, TokenizerConfig
from pipeline.corpus import require_books
from pipeline.downstream.settings import finetune_settings
from pipeline.downstream.task_data import train_pool_documents
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.settings import typed_settings
from pipeline.piece_vectors import piece_vectors as piece_vectors_of


def tokenizer(ctx: StageContext) -> dict:
    tok_cfg = typed_settings(ctx.cfg.tokenizer, TokenizerConfig)
    init_from = typed_settings(ctx.cfg.pretrain, BertPretrainConfig).init_from
    if init_from:  # continued pretraining reads the text as its checkpoint was trained to
        start = Path(init_from).expanduser()
        tok, lowercase = checkpoint_tokenizer(start)
        save_hf_tokenizer(tok, ctx.out_dir, lowercase=lowercase,
                          model_max_length=json.loads((start / "config.json").read_text())["max_position_embeddings"])
        summary = {"from_checkpoint": str(start)}
    else:
        # Streamed from the memory map: the trainer never holds the corpus as Python strings.
        num_sentences, sentences = sampled_texts(ctx.stage_dir("prepare"), tok_cfg.max_sentences)
        tok = train_wordpiece(sentences, ctx.stage_dir("bert_tokenizer"), vocab_size=tok_cfg.vocab_size,
                              min_frequency=tok_cfg.min_frequency, lowercase=tok_cfg.lowercase,
                              limit_alphabet=tok_cfg.limit_alphabet)
        summary = {"sentences": num_sentences,
                   "alphabet": sum(1 for piece in tok.get_vocab() if len(piece) == 1)}  # its characters
    _, sample = sampled_texts(ctx.stage_dir("prepare"), UNKNOWN_RATE_SENTENCES)
    return {"vocab_size": tok.get_vocab_size(), **summary,
            **unknown_rate_summary(*unknown_tokens(tok, sample), "tokenizer.vocab_size (or tokenizer.limit_alphabet)",
                                   warn_above=WORDPIECE_UNKNOWN_RATE_WARNING)}


def embedding_width(cfg: DictConfig, vocab_size: int) -> int:
    """The width of the word embeddings of the BERT that `model` builds: what its piece vectors are trained at."""
    return instantiate(cfg.model.config, vocab_size=vocab_size).hidden_size


def wordpiece_ids(tok: Tokenizer, texts: pa.Array) -> list[list[int]]:
    """The WordPiece ids of each text, each distinct word encoded once (encode_by_word)."""
    return encode_by_word(tok, texts).to_pylist()


def piece_vectors(ctx: StageContext) -> dict:
    """bert_piece_vectors: the shared piece-vector stage (pipeline/piece_vectors.py) over the WordPiece pieces, at the
    width of BERT's word embeddings."""
    return piece_vectors_of(ctx, tokenizer_stage="bert_tokenizer", load_tokenizer=load_tokenizer,
                            encode=wordpiece_ids, width=embedding_width)


def _tokenized_books(shard_path: Path, tok) -> list[list[list[int]]]:
    """The books of one sentence shard as lists of sentences of token ids, in shard order."""
    table = read_arrow(shard_path)
    ids = encode_by_word(tok, table.column("text").combine_chunks()).to_pylist()  # each distinct word encoded once
    books, current = [], None
    for book_id, sentence_ids in zip(table.column("book_id").to_pylist(), ids):
        if book_id != current:
            books.append([])
            current = book_id
        books[-1].append(sentence_ids)
    return books


def build_shard_examples(index: int, shard_and_neighbour: tuple[Path, Path], tokenizer_dir: Path, out_dir: Path,
                         max_seq_length: int, short_seq_prob: float, dupe_factor: int, seed: int,
                         packing: str = "sentence_pairs") -> int:
    """Tokenize shard `index` and write its BERT sentence-pair instances to examples-<index>.arrow.

    Random next sentences come from the shard's other books; a shard holding a single (long) book borrows the
    books of its neighbour shard (the next one, the first for the last) for that, and only for that. One seed per
    shard, derived from the run seed."""
    use_one_tokenizer_thread()
    shard_path, neighbour_path = shard_and_neighbour
    tok = load_tokenizer(tokenizer_dir)
    books = _tokenized_books(shard_path, tok)
    pairs = packing == "sentence_pairs"
    borrowed = _tokenized_books(neighbour_path, tok) if pairs and len(books) < 2 and neighbour_path != shard_path \
        else []
    instances = create_training_instances(books, max_seq_length, short_seq_prob, dupe_factor,
                                          random.Random(seed * 1000 + index), random_next_documents=borrowed,
                                          packing=packing)
    write_instances(instances, out_dir / f"examples-{index:05d}.arrow", tok.token_to_id("[CLS]"),
                    tok.token_to_id("[SEP]"))
    return len(instances)


def examples(ctx: StageContext, length_key: str) -> dict:
    """Sentence-pair instances at the sequence length configured under `length_key` (`bert_examples` at phase 1's,
    `bert_examples_phase2` at phase 2's), built from the same shards and tokenizer with the `examples` settings."""
    require_books(ctx.stage_dir("prepare"), 2, "BERT's sentence pairs take a random next sentence from another book")
    shards = shard_paths(ctx.stage_dir("prepare"))
    ex = typed_settings(ctx.cfg.examples, ExamplesConfig)
    max_seq_length = int(OmegaConf.select(ctx.cfg, length_key))
    # Each task gets its neighbour's path, not the list of all shards: that list in every task's arguments made the
    # arguments grow as shards squared (3,449 shards at 2 GB of books: 345 KB per task, 515 MB in Ray's object store).
    neighbours = list(zip(shards, [*shards[1:], *shards[:1]]))
    counts = ctx.map_shards(build_shard_examples, neighbours, ctx.stage_dir("bert_tokenizer"), ctx.out_dir,
                            max_seq_length, ex.short_seq_prob, ex.dupe_factor, ctx.cfg.seed, str(ex.packing))
    return {"instances": int(sum(counts)), "files": len(counts), "max_seq_length": max_seq_length}


def task_examples(ctx: StageContext, length_key: str) -> dict:
    """bert_examples_tapt: task-adaptive pretraining's instances (Gururangan et al. 2020), one per train text of the
    fine-tuning task that fine-tuning may read (train_pool_documents: never a dev, test or held-out selection text),
    cut at the length configured under `length_key`. One file: a task's train split is small enough for one process
    (Rotten Tomatoes: 11,424 sentences), and its order is the run seed's shuffle."""
    documents = train_pool_documents(ctx.cfg, finetune_settings(ctx.cfg), ctx.name)
    tok = load_tokenizer(ctx.stage_dir("bert_tokenizer"))
    ids = iter(wordpiece_ids(tok, pa.array([text for document in documents for text in document])))
    tokenized = [[next(ids) for _ in document] for document in documents]
    max_seq_length = int(OmegaConf.select(ctx.cfg, length_key))
    # short_seq_prob 0: a document is one text, never cut short of its own end
    instances = create_training_instances(tokenized, max_seq_length, 0.0, 1, random.Random(ctx.cfg.seed),
                                          packing="doc_sentences")
    write_instances(instances, ctx.out_dir / "examples-00000.arrow", tok.token_to_id("[CLS]"),
                    tok.token_to_id("[SEP]"))
    return {"texts": len(documents), "instances": len(instances), "files": 1, "max_seq_length": max_seq_length}
