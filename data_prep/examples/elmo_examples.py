"""ELMo's biLM data: word vocabulary, per-book token streams, truncated-BPTT windows. How a sentence becomes the
model's inputs (<S> ... </S>, bilm-tf character ids) is the model's own encoding, in models/elmo.py.

Peters et al. 2018 train on sentences wrapped in <S> ... </S>; bilm-tf (github.com/allenai/bilm-tf, `data.py`)
streams those sentences into fixed (B, T) windows and carries the LSTM state from one window to the next. We do
the same per *book*: a batch row ("lane") reads one book front to back, window after window, and is reset to a
zero state when it moves on to the next book, so no state ever leaks from one book into another. A window never
spans two books; the tail window of a book is padded (targets ignored), which costs < T tokens per book.

The backward LM reads the same book reversed token by token (bilm-tf's `reverse=True` stream), so both
directions use the same window plan and the same reset mask.

Everything here is a pure function of its arguments (plus an explicit `rng` where there is randomness).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from conventions.elmo_words import BOS, EOS, SPECIAL_WORDS, split_words
from data_prep.corpus.chinese import segment_chinese
from data_prep.corpus.shards import atomic_arrow_file

STREAM_SCHEMA = pa.schema([("book_id", pa.string()), ("tokens", pa.list_(pa.string()))])


def elmo_words(text: str, chinese_words: str = "jieba") -> list[str]:
    """The biLM's words of a text: conventions.elmo_words.split_words (whitespace and punctuation), Chinese first
    segmented into words by `chinese_words` (data_prep/corpus/chinese.py: jieba, or characters), as a run of Chinese is
    no
    word."""
    return split_words(segment_chinese(text, chinese_words))


def count_words(sentences: Iterable[str], chinese_words: str = "jieba") -> Counter:
    """How often each word occurs, words as the biLM reads them (elmo_words)."""
    return Counter(word for text in sentences for word in elmo_words(text, chinese_words))


def build_word_vocab(sentences: Iterable[str], max_size: int, min_count: int,
                     chinese_words: str = "jieba") -> list[str]:
    """<S>, </S>, <UNK>, then the most frequent words of `sentences`: vocab_from_counts of their count_words."""
    return vocab_from_counts(count_words(sentences, chinese_words), max_size, min_count)


def vocab_from_counts(counts: Counter, max_size: int, min_count: int) -> list[str]:
    """<S>, </S>, <UNK>, then the most frequent words (ties broken alphabetically), at most max_size in all.

    Sorted by frequency on purpose: the sampled softmax draws log-uniform (Zipfian) candidates by rank."""
    if max_size <= len(SPECIAL_WORDS):
        raise ValueError(f"elmo.vocab_size={max_size} leaves no room for words next to {SPECIAL_WORDS}; raise it")
    counts = Counter(counts)
    for special in SPECIAL_WORDS:
        counts.pop(special, None)
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return [*SPECIAL_WORDS, *ranked[: max_size - len(SPECIAL_WORDS)]]


def write_word_vocab(words: Sequence[str], path: str | Path) -> None:
    Path(path).write_text("".join(f"{w}\n" for w in words), encoding="utf-8")


def read_word_vocab(path: str | Path) -> list[str]:
    words = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
    if tuple(words[: len(SPECIAL_WORDS)]) != SPECIAL_WORDS:
        raise ValueError(f"{path}: an ELMo vocabulary starts with {SPECIAL_WORDS}; rebuild it with build_word_vocab")
    return words


def books_from_rows(book_ids: Sequence[str], texts: Sequence[str],
                    chinese_words: str = "jieba") -> Iterator[tuple[str, list[str]]]:
    """(book_id, token stream) per book from sentence rows ordered by book, as the sentence shards are: each sentence
    <S> words </S>."""
    current, stream = None, []
    for book_id, text in zip(book_ids, texts):
        if book_id != current:
            if stream:
                yield current, stream
            current, stream = book_id, []
        stream.extend((BOS, *elmo_words(text, chinese_words), EOS))
    if stream:
        yield current, stream


def write_token_streams(books: Iterable[tuple[str, list[str]]], path: str | Path) -> int:
    """One row per book; uncompressed Arrow IPC file so readers can memory-map it, written atomically. Returns the
    number of books."""
    count = 0
    with atomic_arrow_file(path, STREAM_SCHEMA) as writer:
        for book_id, tokens in books:
            columns = [pa.array([book_id]), pa.array([tokens], STREAM_SCHEMA.field("tokens").type)]
            writer.write_batch(pa.record_batch(columns, schema=STREAM_SCHEMA))
            count += 1
    return count


class TokenStreams:
    """Random access to the books of stream files written by `write_token_streams`, memory-mapped."""

    def __init__(self, paths: Sequence[str | Path]):
        tables = [pa.ipc.open_file(pa.memory_map(str(p), "r")).read_all() for p in paths]
        self._rows = [(t, r) for t in tables for r in range(t.num_rows)]
        self.book_ids = [t.column("book_id")[r].as_py() for t, r in self._rows]
        self.lengths = np.array([len(t.column("tokens")[r].values) for t, r in self._rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._rows)

    def tokens(self, book: int) -> list[str]:
        table, row = self._rows[book]
        return table.column("tokens")[row].values.to_pylist()


def split_books(num_books: int, holdout_fraction: float, max_holdout: int,
                rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(train, held-out) book indices: whole books are held out, `holdout_fraction` of them but at most `max_holdout`
    (every validation reads all of them), at least one, never all."""
    if num_books < 2:
        raise ValueError(f"{num_books} book(s): held-out perplexity needs at least 2 books (one to train on)")
    order = rng.permutation(num_books)
    n_holdout = min(num_books - 1, max_holdout, max(1, round(num_books * holdout_fraction)))
    return sorted(order[n_holdout:].tolist()), sorted(order[:n_holdout].tolist())


@dataclass(frozen=True)
class WindowSlot:
    """What one batch row holds at one step: `length` inputs of `book` from stream position `start`."""
    book: int
    start: int
    length: int
    reset: bool  # first window of its book: the row's carried LSTM state must be zeroed first


def plan_windows(book_lengths: Sequence[int], batch_size: int, window: int) -> Iterator[list[WindowSlot | None]]:
    """Truncated-BPTT schedule: one list of batch_size slots (None = idle row) per step.

    A book of n tokens gives n - 1 (input, next token) pairs, cut into ceil((n - 1) / window) windows. Each row
    takes the next unread book (in the given order) as soon as it finishes one, so rows stay busy until the books
    run out; the schedule ends when every row is idle."""
    queue = iter(b for b, n in enumerate(book_lengths) if n >= 2)
    lanes: list[list[int] | None] = [None] * batch_size  # [book, next start] per row
    while True:
        slots: list[WindowSlot | None] = []
        for row in range(batch_size):
            reset = False
            lane = lanes[row]
            if lane is None or lane[1] >= book_lengths[lane[0]] - 1:
                book = next(queue, None)
                lane = lanes[row] = None if book is None else [book, 0]
                reset = True
            if lane is None:
                slots.append(None)
                continue
            book, start = lane
            length = min(window, book_lengths[book] - 1 - start)
            slots.append(WindowSlot(book, start, length, reset))
            lane[1] += length
        if all(s is None for s in slots):
            return
        yield slots
