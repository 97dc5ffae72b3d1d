"""Sentence shards -> token-id shards (Arrow `list<int32>` per sentence), one shard per call.

The WordPiece encoder is the bottleneck of the data pipeline (about 2-3 MB/s per process on this project's
machine, most of it per-character normalisation with alignment tracking inside `tokenizers`), so each
distinct word of a shard is encoded once and the ids are gathered for every occurrence, the way
`tokenizers`' own BPE model caches words. Words repeat heavily, and more so once punctuation is cut off
and ASCII lowercased as BERT's pre-tokenizer and normaliser would do (an 8 MB shard of novels: 1.1M
whitespace-separated words, 78k distinct with their punctuation attached, 28k without). The ids are
identical to encoding each sentence: BERT's pre-tokenizer splits at every whitespace and punctuation
character, so encoding the pieces between them separately and concatenating gives the same ids, provided
control characters, which BERT's normaliser deletes rather than treating as a break, are deleted first.

The distinct words are not encoded one sequence each either: `tokenizers` spends most of its time per
sequence (an `Encoding` with its masks and alignment vectors), not per character, so the words go through
it ~1000 at a time as one text, each followed by the [SEP] special token, which the encoder extracts before
normalising and which splits the ids back into words. This halves the encoder's time again; words that
contain a special token's text themselves are encoded alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from data_prep.corpus.shards import atomic_arrow_file
from data_prep.corpus.tokenizer import SEP_TOKEN, encode_batch_ids

TOKEN_SCHEMA = pa.schema([
    ("book_id", pa.string()),
    ("paragraph_index", pa.int32()),
    ("sentence_index", pa.int32()),
    ("input_ids", pa.list_(pa.int32())),
])
# Cc characters except \t \n \r: BERT's clean_text (tokenizers' BertNormalizer) deletes them, so
# "a\x0bb" is one word to it, while Arrow's whitespace split would cut at \x0b and \x85.
_DELETED_CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
# What BERT's pre-tokenizer cuts off as a word of its own (tokenizers' is_bert_punc): Unicode punctuation (P*) and
# the ASCII symbols that google-research/bert's _is_punctuation counts too. RE2 syntax (Arrow's regex engine).
_BERT_PUNCTUATION = r"[\p{P}$+<=>^`|~]"
# Words per encoded text: past ~1000 the per-sequence cost is amortised; more would only make the batches
# handed to the Rust thread pool fewer and coarser.
_WORDS_PER_TEXT = 1024


def _special_token_pattern(tokenizer: Tokenizer) -> str:
    """A regex (Python and RE2 alike) matching the text of any added token, e.g. "[SEP]"."""
    return "|".join(re.escape(token.content) for token in tokenizer.get_added_tokens_decoder().values())


def _splice(flat: np.ndarray, lengths: np.ndarray, positions: np.ndarray, pieces: list[list[int]]) -> np.ndarray:
    """`flat` holds the ids of every item but those at `positions`; returns the ids of all items in order, with
    `pieces` (the ids of the items at `positions`) put in their places. Sets `lengths[positions]`."""
    lengths[positions] = [len(piece) for piece in pieces]
    is_piece = np.zeros(len(lengths), dtype=bool)
    is_piece[positions] = True
    in_pieces = np.repeat(is_piece, lengths)
    merged = np.empty(int(lengths.sum()), dtype=np.int32)
    merged[~in_pieces] = flat
    merged[in_pieces] = [i for piece in pieces for i in piece]
    return merged


def encode_words(tokenizer: Tokenizer, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all words concatenated as int32, number of ids of each word as int64), equal to encoding
    each word alone."""
    separator = tokenizer.token_to_id(SEP_TOKEN)
    if separator is None:
        raise ValueError(f"the tokenizer has no {SEP_TOKEN} token; train it with "
                         "data_prep.corpus.tokenizer.train_wordpiece")
    special = re.compile(_special_token_pattern(tokenizer), re.IGNORECASE)
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
        flat = _splice(flat, lengths, np.array(alone), encode_batch_ids(tokenizer, [words[i] for i in alone]))
    return flat, lengths


# Words a process has encoded, with their ids, for the tokenizer it used last: a Ray worker tokenizing shard after
# shard meets mostly words it has encoded before (gutenberg-raw in 13 shards: 366k distinct words summed over the
# shards, 105k in the whole corpus). Capped, so an open-ended vocabulary cannot grow a worker without limit.
_CACHED_WORDS_MAX = 1_000_000


@dataclasses.dataclass
class _EncodedWords:
    tokenizer_digest: bytes
    ids: dict[str, tuple[int, ...]]


_encoded_words: _EncodedWords | None = None


def encode_words_cached(tokenizer: Tokenizer, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`encode_words`, remembering each word's ids in this process for later calls with the same tokenizer."""
    global _encoded_words
    digest = hashlib.blake2b(tokenizer.to_str().encode(), digest_size=16).digest()
    if _encoded_words is None or _encoded_words.tokenizer_digest != digest:
        _encoded_words = _EncodedWords(digest, {})
    known = _encoded_words.ids
    missing = [word for word in words if word not in known]
    fresh = {}
    if missing:
        flat, lengths = encode_words(tokenizer, missing)
        flat, ends = flat.tolist(), np.cumsum(lengths).tolist()
        fresh = {word: tuple(flat[end - length:end]) for word, length, end in zip(missing, lengths.tolist(), ends)}
        if len(known) + len(fresh) <= _CACHED_WORDS_MAX:
            known.update(fresh)
    ids = [fresh[word] if word in fresh else known[word] for word in words]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def _pre_split(tokenizer: Tokenizer, texts: pa.Array) -> pa.Array:
    """The texts with what the tokenizer would cut or fold anyway done in Arrow's kernels, so that fewer distinct
    words reach the encoder ("House," "house." "(house" are all "house" plus punctuation): BERT's pre-tokenizer makes
    every punctuation character a word of its own, and a lowercasing normaliser maps A-Z to a-z whatever else it
    does to a character (so lowercasing ASCII first changes nothing). Other tokenizers get only the control
    characters deleted."""
    texts = pc.replace_substring_regex(texts, _DELETED_CONTROLS, "")
    if isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer):
        texts = pc.replace_substring_regex(texts, _BERT_PUNCTUATION, r" \0 ")
    if isinstance(tokenizer.normalizer, normalizers.BertNormalizer) and tokenizer.normalizer.lowercase:
        texts = pc.ascii_lower(texts)
    return texts


def encode_by_word(tokenizer: Tokenizer, texts: pa.Array) -> pa.ListArray:
    """Token ids of each text, without special tokens; equal to `encode_batch_ids(tokenizer, texts)`.

    A text holding a special token's text ("[SEP]" typed into a book) is encoded whole: the tokenizer matches those
    before any normalising, which pre-splitting at punctuation would break apart."""
    has_special = pc.match_substring_regex(texts, _special_token_pattern(tokenizer), ignore_case=True)
    has_special = has_special.to_numpy(zero_copy_only=False)
    special_texts = np.flatnonzero(has_special)
    words_per_text = pc.utf8_split_whitespace(_pre_split(tokenizer, pc.if_else(has_special, "", texts)))
    # The split keeps "" for leading or trailing whitespace; like every word it is encoded once (to no ids).
    encoded = pc.dictionary_encode(words_per_text.flatten())
    flat_per_word, lengths_per_word = encode_words_cached(tokenizer, encoded.dictionary.to_pylist())
    ids_per_word = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lengths_per_word)]), pa.int32()),
                                            pa.array(flat_per_word, pa.int32()))
    ids_per_occurrence = ids_per_word.take(encoded.indices)  # one gather in Arrow's kernels, no index arithmetic
    flat_ids = ids_per_occurrence.flatten().to_numpy()
    word_offsets = words_per_text.offsets.to_numpy()
    text_offsets = ids_per_occurrence.offsets.to_numpy()[word_offsets - word_offsets[0]]
    if len(special_texts):
        lengths_per_text = np.diff(text_offsets)
        flat_ids = _splice(flat_ids, lengths_per_text, special_texts,
                           encode_batch_ids(tokenizer, [texts[int(i)].as_py() for i in special_texts]))
        text_offsets = np.concatenate([[0], np.cumsum(lengths_per_text)])
    return pa.ListArray.from_arrays(pa.array(text_offsets, pa.int32()), pa.array(flat_ids, pa.int32()))


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
