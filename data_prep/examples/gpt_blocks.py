"""GPT's data: a byte-level BPE trained on the corpus, and the books packed into fixed-length blocks of a token stream.

Byte-level BPE is GPT-2's tokenizer (Radford et al. 2019, §2.2): every string encodes, with no unknown token and no
normalisation, so generated text decodes back to exactly what the model produced. It is trained on this corpus rather
than taken from GPT-2, as BERT's WordPiece is: the comparison of the two families is on the same books.

Packing follows GPT-2 and nanoGPT: the books of a shard, in order, form one stream of ids with <|endoftext|> after
each book, cut into blocks of block_size + 1 tokens that overlap by one, so block i is stream[i * block_size:
(i + 1) * block_size + 1]; a model reads a block's first block_size tokens and predicts its last block_size, and every
token of the stream after the first is a target exactly once. Only the tail too short for a block is dropped.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer
from tokenizers.implementations import ByteLevelBPETokenizer

from data_prep.corpus.shards import atomic_arrow_file

END_OF_TEXT = "<|endoftext|>"
# Byte-level BPE starts from the 256 byte pieces, whatever vocab_size asks for: fewer gave 257 entries, silently
MIN_VOCAB_SIZE = 256 + 1  # and <|endoftext|>
TOKENIZER_FILE = "tokenizer.json"
BLOCK_SCHEMA = pa.schema([("ids", pa.list_(pa.int32()))])


def train_byte_level_bpe(texts: Iterable[str], out_dir: Path, vocab_size: int, min_frequency: int,
                         special_tokens: Sequence[str] = (END_OF_TEXT,)) -> Tokenizer:
    """Train GPT-2's tokenizer on `texts` and write it to out_dir as tokenizer.json. The special tokens take the first
    ids, in order (GPT's <|endoftext|>; the seq2seq family's padding, start, end, mask and sentinels)."""
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)  # GPT-2's: a leading space is part of the next word's token
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                            special_tokens=list(special_tokens))
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe.save(str(out_dir / TOKENIZER_FILE))
    return Tokenizer.from_file(str(out_dir / TOKENIZER_FILE))


def write_hf_tokenizer_config(out_dir: Path, model_max_length: int) -> None:
    """What lets transformers' AutoTokenizer load tokenizer.json in out_dir as a GPT2TokenizerFast."""
    # GPT-2 uses <|endoftext|> as its beginning, end and unknown token alike
    config = {"tokenizer_class": "GPT2TokenizerFast", "model_max_length": model_max_length, "add_prefix_space": False,
              "bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_gpt_tokenizer(directory: Path) -> Tokenizer:
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; run the gpt_tokenizer stage first")
    return Tokenizer.from_file(str(path))


def end_of_text_id(tokenizer: Tokenizer) -> int:
    eot = tokenizer.token_to_id(END_OF_TEXT)
    if eot is None:
        raise ValueError(f"the tokenizer has no {END_OF_TEXT} token; train it with train_byte_level_bpe")
    return eot


def book_texts(book_ids: list, sentences: list[str]) -> Iterator[str]:
    """Each book of a sentence shard (rows in book order, as data_prep.corpus.prepare writes them) as one text."""
    current, book = None, []
    for book_id, sentence in zip(book_ids, sentences):
        if book_id != current and book:
            yield " ".join(book)
            book = []
        current = book_id
        book.append(sentence)
    if book:
        yield " ".join(book)


def pack_blocks(books: Iterable[list[int]], eot: int, block_size: int, last_book_ends: bool = True) -> np.ndarray:
    """(n, block_size + 1) int32 blocks of the stream `book, eot, book, eot, ...` (the module docstring's layout).
    last_book_ends=False: the last book goes on in the next shard (a book larger than a shard,
    data_prep.corpus.shards), so
    no end-of-text follows it here."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    books = list(books)
    stream = np.fromiter((t for i, book in enumerate(books)
                          for t in (*book, *((eot,) if last_book_ends or i < len(books) - 1 else ()))),
                         dtype=np.int32)
    n = max(0, (len(stream) - 1) // block_size)
    starts = np.arange(n)[:, None] * block_size
    return stream[starts + np.arange(block_size + 1)]


def write_blocks(blocks: np.ndarray, path: Path) -> None:
    width = blocks.shape[1]
    offsets = pa.array(np.arange(len(blocks) + 1, dtype=np.int32) * width)
    ids = pa.ListArray.from_arrays(offsets, pa.array(blocks.reshape(-1), type=pa.int32()))
    with atomic_arrow_file(path, BLOCK_SCHEMA) as writer:
        writer.write_table(pa.table([ids], schema=BLOCK_SCHEMA))


def shard_blocks(book_ids: list, sentences: list[str], tokenizer: Tokenizer, block_size: int,
                 next_shard_first_book: str | None) -> np.ndarray:
    """The blocks of one sentence shard: its books tokenized and packed, the last one without an end-of-text when
    the next shard starts with the rest of it."""
    encodings = tokenizer.encode_batch(list(book_texts(book_ids, sentences)))
    return pack_blocks((e.ids for e in encodings), end_of_text_id(tokenizer), block_size,
                       last_book_ends=not book_ids or book_ids[-1] != next_shard_first_book)
