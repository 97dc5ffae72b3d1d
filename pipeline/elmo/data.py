"""ELMo's pretraining batches: truncated-BPTT windows, not sentence batches. Every row reads one book front to back,
window after window, starting each window from the LSTM state the previous one ended in (bilm-tf), and from a zero state
at each new book. Why: books are long contiguous text, so the LM learns context across sentence boundaries as bilm-tf's
does, no position is padding except a book's last window, and every step has the same (B, T) shapes, which keeps the
matmuls large and the throughput steady (see benchmarks/bench_elmo.py).

The loaders over them must keep batch_size=None, no shuffling and num_workers <= 1: the state carry
(pipeline/elmo/module.py) relies on batch i + 1 continuing the rows of batch i.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset

from data_prep.examples.elmo_examples import TokenStreams, WindowSlot, plan_windows, split_books
from models import IGNORE_INDEX
from models.elmo import MAX_CHARACTERS_PER_TOKEN, tokens_char_ids, word_ids


class LMWindowBatches(IterableDataset):
    """(B, T) windows of the forward stream and of the reversed (backward) stream of the given books, with the
    per-row reset mask. Targets are output-vocabulary ids (IGNORE_INDEX where a row has no token); inputs are
    character ids (char-CNN) or the same word ids (word-input biLM).

    repeat=False: one pass in the given book order (held-out data). repeat=True: endless epochs, the book order
    reshuffled each epoch from `seed` (training); with `world_size` > 1, rank `rank` reads every world_size-th book of
    each epoch's order, so ranks never share a book. `start`: window batches of the plan to skip (a resumed run's
    position; pipeline/elmo/pretrain.py's WindowPosition)."""

    def __init__(self, streams: TokenStreams, books: Sequence[int], vocab: Sequence[str], batch_size: int,
                 window: int, char_inputs: bool = True, max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN,
                 repeat: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1):
        if len(books) < world_size:
            raise ValueError(f"{len(books)} training book(s) cannot be shared by {world_size} workers, each of which "
                             "reads whole books; use more books or fewer workers (distributed.num_workers)")
        self.streams, self.books = streams, list(books)
        self.word_index = {w: i for i, w in enumerate(vocab)}
        self.batch_size, self.window = batch_size, window
        self.char_inputs, self.max_chars = char_inputs, max_characters_per_token
        self.repeat, self.seed = repeat, seed
        self.rank, self.world_size = rank, world_size
        self.start = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        skip = self.start
        for epoch in itertools.count() if self.repeat else (0,):
            order = list(self.books)
            if self.repeat:
                np.random.default_rng([self.seed, epoch]).shuffle(order)
            order = order[self.rank::self.world_size]
            open_books: dict[int, tuple[list[str], np.ndarray]] = {}  # plan index -> (tokens, word ids)
            for slots in plan_windows([int(self.streams.lengths[b]) for b in order], self.batch_size, self.window):
                if skip:  # planning is cheap; the skipped windows are never read
                    skip -= 1
                    continue
                yield self._batch(slots, order, open_books)

    def _batch(self, slots: list[WindowSlot | None], order: list[int], open_books: dict) -> dict[str, torch.Tensor]:
        B, T = self.batch_size, self.window
        input_shape = (2, B, T, self.max_chars) if self.char_inputs else (2, B, T)
        inputs = np.zeros(input_shape, dtype=np.int64)  # [forward, backward]
        targets = np.full((2, B, T), IGNORE_INDEX, dtype=np.int64)
        reset = np.ones(B, dtype=bool)
        for row, slot in enumerate(slots):
            if slot is None:
                continue
            if slot.book not in open_books:
                tokens = self.streams.tokens(order[slot.book])
                open_books[slot.book] = (tokens, word_ids(tokens, self.word_index))
            tokens, ids = open_books[slot.book]
            reset[row] = slot.reset
            n, s, k = len(tokens), slot.start, slot.length
            for direction, (toks, tids) in enumerate(((tokens, ids), (tokens[::-1], ids[::-1]))):
                window_tokens = toks[s: s + k]
                inputs[direction, row, :k] = (tokens_char_ids(window_tokens, self.max_chars) if self.char_inputs
                                              else tids[s: s + k])
                targets[direction, row, :k] = tids[s + 1: s + k + 1]
            if s + k >= n - 1:
                del open_books[slot.book]  # its last window: the tokens are not needed again
        inputs, targets = torch.from_numpy(inputs), torch.from_numpy(targets)
        return {"forward_inputs": inputs[0], "backward_inputs": inputs[1], "forward_targets": targets[0],
                "backward_targets": targets[1], "reset": torch.from_numpy(reset)}


def build_elmo_datasets(stream_paths: Sequence[str | Path], vocab: Sequence[str], window: int, batch_size: int,
                        holdout_books_fraction: float, holdout_max_books: int, seed: int, char_inputs: bool = True,
                        max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN, rank: int = 0, world_size: int = 1
                        ) -> tuple[LMWindowBatches, LMWindowBatches]:
    """(train, held-out) window batches over the books of the stream files; whole books are held out, chosen by
    `seed`; the training books are shared out between `world_size` ranks. Wrap each in
    DataLoader(dataset, batch_size=None)."""
    streams = TokenStreams(stream_paths)
    train_books, heldout_books = split_books(len(streams), holdout_books_fraction, holdout_max_books,
                                             np.random.default_rng(seed))
    common = dict(streams=streams, vocab=vocab, batch_size=batch_size, window=window, char_inputs=char_inputs,
                  max_characters_per_token=max_characters_per_token)
    return (LMWindowBatches(books=train_books, repeat=True, seed=seed, rank=rank, world_size=world_size, **common),
            LMWindowBatches(books=heldout_books, repeat=False, **common))
