"""Pretraining's datasets and loaders, for every family whose training data are rows of Arrow files (BERT's
instances, GPT's blocks, Skip-Thought's triples): rows sliced out of the memory-mapped files on demand, so RAM does
not grow with the corpus; a seeded share held out; training batches in a resumable seeded order, each rank its own
(pipeline/engine/sampler.py). ELMo's truncated-BPTT windows are a stream of their own (pipeline/elmo/data.py): each
batch continues the rows of the one before, which a shuffled order would break."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from pipeline.engine.arrow import list_column
from pipeline.engine.sampler import ResumableRandomSampler, SeededBatchSampler, held_out_count


class ArrowRows(Dataset):
    """Rows of the Arrow files' `lists` columns (lists of integers: int64 arrays, copies) and `scalars` columns
    (Python numbers), as dicts keyed by column name."""

    def __init__(self, tables: list[pa.Table], lists: Sequence[str], scalars: Sequence[str] = ()):
        tables = [t for t in tables if t.num_rows]
        self.lists, self.scalars = tuple(lists), tuple(scalars)
        self.parts = [([list_column(t, name) for name in self.lists], [t.column(name).to_numpy() for name in scalars])
                      for t in tables]
        self.cumulative = np.cumsum([t.num_rows for t in tables])

    def __len__(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    def __getitem__(self, index: int) -> dict:
        part = int(np.searchsorted(self.cumulative, index, side="right"))
        row = index - (int(self.cumulative[part - 1]) if part else 0)
        lists, scalars = self.parts[part]
        # Copies of one row: tensors must not alias the read-only memory map.
        return {**{name: values[offsets[row]: offsets[row + 1]].astype(np.int64)
                   for name, (offsets, values) in zip(self.lists, lists)},
                **{name: column[row].item() for name, column in zip(self.scalars, scalars)}}

    def values(self, name: str) -> list[np.ndarray]:
        """The values of list column `name`, every row's concatenated, one array per file (memory-mapped)."""
        return [lists[self.lists.index(name)][1] for lists, _ in self.parts]

    def arrays(self) -> list[np.ndarray]:
        """Every array the rows are sliced from."""
        return [array for lists, scalars in self.parts for array in (*(a for pair in lists for a in pair), *scalars)]


class CollatedBatches(Dataset):
    """Batches keyed by SeededBatchSampler's `(seed, indices)`: the rows at `indices`, collated. For data with no
    random augmentation: the seed goes unused (BERT's dynamic masking draws from it: pipeline/bert/data.py)."""

    def __init__(self, rows: Dataset, collate: Callable[[list], dict]):
        self.rows, self.collate = rows, collate

    def __getitem__(self, key: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
        _, indices = key
        return self.collate([self.rows[i] for i in indices])


def held_out_split(total: int, fraction: float, most: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-out indices) of `total` rows: a seeded random `fraction` held out, at most `most`
    (held_out_count). numpy indices, not lists: a list of 10^7 Python ints would take ~0.4 GB in the driver and in
    every loader worker."""
    order = np.random.default_rng(seed).permutation(total)
    n_val = held_out_count(total, fraction, most)
    return order[n_val:], order[:n_val]


def seeded_train_loader(batches: Dataset, rows: int, batch_size: int, seed: int, num_workers: int = 0, rank: int = 0,
                        world_size: int = 1) -> DataLoader:
    """Training batches of rank `rank` of `world_size` from `batches` (keyed by `(seed, indices)` into `rows` rows),
    in a resumable seeded order: the loader's `sampler` is a SeededBatchSampler, whose state a checkpoint keeps."""
    sampler = SeededBatchSampler(ResumableRandomSampler(rows, seed, world_size, rank), batch_size)
    # A generator of its own: creating a loader iterator would otherwise draw from the global RNG (dropout's).
    return DataLoader(batches, sampler=sampler, batch_size=None, num_workers=num_workers,
                      generator=torch.Generator().manual_seed(seed))


def pretraining_loaders(rows: Dataset, collate: Callable[[list], dict], batch_size: int, val_fraction: float,
                        val_max: int, seed: int, num_workers: int = 0, rank: int = 0,
                        world_size: int = 1) -> tuple[DataLoader, DataLoader]:
    """Training batches of rank `rank` (seeded_train_loader) and the held-out batches, the same on every rank: a
    seeded random `val_fraction` of the rows, at most `val_max` (2 % of BookCorpus's 74 M sentences would be 1.5 M
    triples scored at every validation), in file order."""
    train, held_out = held_out_split(len(rows), val_fraction, val_max, seed)
    loader = seeded_train_loader(CollatedBatches(Subset(rows, train), collate), len(train), batch_size, seed,
                                 num_workers, rank, world_size)
    val = DataLoader(Subset(rows, sorted(held_out.tolist())), batch_size=batch_size, collate_fn=collate,
                     generator=torch.Generator().manual_seed(seed))
    return loader, val
