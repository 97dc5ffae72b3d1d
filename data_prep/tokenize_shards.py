"""Sentence shards -> token-id shards (Arrow `list<int32>` per sentence), one shard per call.

The WordPiece encoder is the bottleneck of the data pipeline (about 2-3 MB/s per process on this project's
machine, most of it per-character normalisation with alignment tracking inside `tokenizers`), so each
distinct whitespace-separated word of a shard is encoded once and the ids are gathered for every
occurrence, the way `tokenizers`' own BPE model caches words. Words repeat heavily (a 3 MB novel has
~570k words but ~40k distinct ones with their punctuation attached). The ids are identical to encoding
each sentence: BERT's pre-tokenizer splits at every whitespace (and more), so encoding the pieces between
whitespace separately and concatenating gives the same ids, provided control characters, which BERT's
normaliser deletes rather than treating as a break, are deleted first.

The distinct words are not encoded one sequence each either: `tokenizers` spends most of its time per
sequence (an `Encoding` with its masks and alignment vectors), not per character, so the words go through
it ~1000 at a time as one text, each followed by the [SEP] special token, which the encoder extracts before
normalising and which splits the ids back into words. This halves the encoder's time again; words that
contain a special token's text themselves are encoded alone.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from data_prep.shards import atomic_arrow_file
from data_prep.tokenizer import SEP_TOKEN, encode_batch_ids

TOKEN_SCHEMA = pa.schema([
    ("book_id", pa.string()),
    ("paragraph_index", pa.int32()),
    ("sentence_index", pa.int32()),
    ("input_ids", pa.list_(pa.int32())),
])
# Cc characters except \t \n \r: BERT's clean_text (tokenizers' BertNormalizer) deletes them, so
# "a\x0bb" is one word to it, while Arrow's whitespace split would cut at \x0b and \x85.
_DELETED_CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
# Words per encoded text: past ~1000 the per-sequence cost is amortised; more would only make the batches
# handed to the Rust thread pool fewer and coarser.
_WORDS_PER_TEXT = 1024


def encode_words(tokenizer: Tokenizer, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all words concatenated as int32, number of ids of each word as int64), equal to encoding
    each word alone."""
    separator = tokenizer.token_to_id(SEP_TOKEN)
    if separator is None:
        raise ValueError(f"the tokenizer has no {SEP_TOKEN} token; train it with data_prep.tokenizer.train_wordpiece")
    special = re.compile("|".join(re.escape(token.content) for token in tokenizer.get_added_tokens_decoder().values()),
                         re.IGNORECASE)
    alone = [i for i, word in enumerate(words) if special.search(word)]
    together = np.ones(len(words), dtype=bool)
    together[alone] = False
    joined = [words[i] for i in np.flatnonzero(together)]
    texts = [" ".join(f"{word} {SEP_TOKEN}" for word in joined[start:start + _WORDS_PER_TEXT])
             for start in range(0, len(joined), _WORDS_PER_TEXT)]
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    ids = np.concatenate([np.zeros(0, np.int32)] + [np.array(encoding.ids, dtype=np.int32) for encoding in encodings])
    is_separator = ids == separator
    ends = np.flatnonzero(is_separator)
    if len(ends) != len(joined):
        raise RuntimeError(f"{len(joined)} words came back as {len(ends)}: a word produced or swallowed {SEP_TOKEN}")
    lengths = np.zeros(len(words), dtype=np.int64)
    lengths[together] = np.diff(ends, prepend=-1) - 1
    flat = ids[~is_separator]
    if alone:
        # splice the words encoded alone back in at their places
        alone_ids = encode_batch_ids(tokenizer, [words[i] for i in alone])
        lengths[alone] = [len(word_ids) for word_ids in alone_ids]
        merged = np.empty(int(lengths.sum()), dtype=np.int32)
        in_together = np.repeat(together, lengths)
        merged[in_together] = flat
        merged[~in_together] = [i for word_ids in alone_ids for i in word_ids]
        flat = merged
    return flat, lengths


def encode_by_word(tokenizer: Tokenizer, texts: pa.Array) -> pa.ListArray:
    """Token ids of each text, without special tokens; equal to `encode_batch_ids(tokenizer, texts)`."""
    cleaned = pc.replace_substring_regex(texts, _DELETED_CONTROLS, "")
    words_per_text = pc.utf8_split_whitespace(cleaned)
    words = words_per_text.flatten()
    nonempty = pc.greater(pc.utf8_length(words), 0)  # the split keeps "" for leading/trailing whitespace
    encoded = pc.dictionary_encode(words)
    flat_per_word, lengths_per_word = encode_words(tokenizer, encoded.dictionary.to_pylist())
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


def use_one_tokenizer_thread() -> None:
    """Call first in a worker process that shares the cores with others (a Ray task with num_cpus=1): the Rust
    encoder's thread pool starts one thread per core in every process unless told otherwise (Ray sets
    OMP_NUM_THREADS for its tasks, not this), so two workers on two cores would run four threads. Takes effect if
    nothing in the process has encoded yet."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")


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
