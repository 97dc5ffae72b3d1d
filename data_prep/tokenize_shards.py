"""Sentence shards -> token-id shards (Arrow `list<int32>` per sentence), one shard per call.

The WordPiece encoder is the bottleneck of the data pipeline (about 2-3 MB/s per process on this project's
machine, most of it per-character normalisation with alignment tracking inside `tokenizers`), so each
distinct whitespace-separated word of a shard is encoded once and the ids are gathered for every
occurrence, the way `tokenizers`' own BPE model caches words. Words repeat heavily (a 3 MB novel has
~570k words but ~40k distinct ones with their punctuation attached). The ids are identical to encoding
each sentence: BERT's pre-tokenizer splits at every whitespace (and more), so encoding the pieces between
whitespace separately and concatenating gives the same ids, provided control characters, which BERT's
normaliser deletes rather than treating as a break, are deleted first.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from data_prep.shards import atomic_arrow_file
from data_prep.tokenizer import encode_batch_ids

TOKEN_SCHEMA = pa.schema([
    ("book_id", pa.string()),
    ("paragraph_index", pa.int32()),
    ("sentence_index", pa.int32()),
    ("input_ids", pa.list_(pa.int32())),
])
# Cc characters except \t \n \r: BERT's clean_text (tokenizers' BertNormalizer) deletes them, so
# "a\x0bb" is one word to it, while Arrow's whitespace split would cut at \x0b and \x85.
_DELETED_CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"


def encode_by_word(tokenizer: Tokenizer, texts: pa.Array) -> pa.ListArray:
    """Token ids of each text, without special tokens; equal to `encode_batch_ids(tokenizer, texts)`."""
    cleaned = pc.replace_substring_regex(texts, _DELETED_CONTROLS, "")
    words_per_text = pc.utf8_split_whitespace(cleaned)
    words = words_per_text.flatten()
    nonempty = pc.greater(pc.utf8_length(words), 0)  # the split keeps "" for leading/trailing whitespace
    encoded = pc.dictionary_encode(words)
    vocabulary = encoded.dictionary.to_pylist()
    ids_per_word = encode_batch_ids(tokenizer, vocabulary)
    lengths_per_word = np.fromiter(map(len, ids_per_word), dtype=np.int64, count=len(ids_per_word))
    flat_per_word = np.fromiter((i for ids in ids_per_word for i in ids), dtype=np.int32,
                                count=int(lengths_per_word.sum()))
    starts_per_word = np.concatenate([[0], np.cumsum(lengths_per_word)])

    occurrence = encoded.indices.to_numpy(zero_copy_only=False)
    occurrence_lengths = np.where(nonempty.to_numpy(zero_copy_only=False), lengths_per_word[occurrence], 0)
    # every id of every occurrence: start of its word's ids plus 0..length-1
    occurrence_ends = np.cumsum(occurrence_lengths)
    total = int(occurrence_ends[-1]) if len(occurrence_ends) else 0
    position_in_word = np.arange(total) - np.repeat(occurrence_ends - occurrence_lengths, occurrence_lengths)
    flat_ids = flat_per_word[np.repeat(starts_per_word[occurrence], occurrence_lengths) + position_in_word]

    word_offsets = words_per_text.offsets.to_numpy()
    text_offsets = np.concatenate([[0], occurrence_ends])[word_offsets - word_offsets[0]].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(text_offsets), pa.array(flat_ids, pa.int32()))


def tokenize_shard(shard_path: str | os.PathLike, tokenizer_path: str | os.PathLike,
                   out_path: str | os.PathLike) -> int:
    """Writes the token ids of one sentence shard to `out_path` (Arrow IPC file, TOKEN_SCHEMA, same rows in
    the same order), atomically; returns the number of tokens. One Ray task per shard in a pipeline stage."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    table = pa.ipc.open_file(pa.memory_map(str(shard_path))).read_all()
    ids = encode_by_word(tokenizer, table.column("text").combine_chunks())
    out = pa.table([table["book_id"], table["paragraph_index"], table["sentence_index"], ids], schema=TOKEN_SCHEMA)
    with atomic_arrow_file(out_path, TOKEN_SCHEMA) as writer:
        writer.write_table(out)
    return len(ids.values)
