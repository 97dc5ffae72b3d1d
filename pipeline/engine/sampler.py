"""Resumable, deterministic data order for pretraining: the position in the data is part of a checkpoint.

Epoch `e` visits a permutation drawn from `seed + e`, so any (epoch, position) can be reached again in O(1), by
slicing, without replaying batches. Under data parallelism each rank takes every `num_replicas`-th index of that
permutation: ranks never share an index, and together they cover the epoch's permutation (trimmed to a multiple
of `num_replicas`, so every rank runs the same number of steps; the trimmed tail differs from epoch to epoch).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler


class ResumableRandomSampler(Sampler[int]):
    """Shuffled dataset indices for one rank; `state_dict()` is (epoch, indices of this epoch yielded so far)."""

    def __init__(self, num_samples: int, seed: int, num_replicas: int = 1, rank: int = 0):
        if num_samples < num_replicas:
            raise ValueError(f"{num_samples} samples cannot be shared by {num_replicas} ranks; "
                             "use more data or fewer workers")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.num_samples, self.seed = num_samples, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return self.num_samples // self.num_replicas

    def permutation(self, epoch: int) -> torch.Tensor:
        """This rank's indices of `epoch`, in order."""
        order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        return order[self.rank: len(self) * self.num_replicas: self.num_replicas]

    def set_epoch(self, epoch: int) -> None:
        """Called by the training loop before each epoch; a new epoch starts at its beginning."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[int]:
        for index in self.permutation(self.epoch)[self.position:].tolist():
            self.position += 1
            yield index

    def state_dict(self) -> dict:
        return {"seed": self.seed, "num_replicas": self.num_replicas, "epoch": self.epoch,
                "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["num_replicas"]) != (self.seed, self.num_replicas):
            raise ValueError(f"the checkpoint's data order (seed {state['seed']}, {state['num_replicas']} ranks) "
                             f"is not this run's (seed {self.seed}, {self.num_replicas} ranks); resume with the "
                             "same seed and number of workers, or start in a new output directory")
        if not 0 <= state["position"] <= len(self):
            raise ValueError(f"position {state['position']} is outside this rank's epoch of {len(self)} samples")
        self.epoch, self.position = state["epoch"], state["position"]


class SeededBatchSampler(Sampler[tuple[int, list[int]]]):
    """Batches of a ResumableRandomSampler, each with a seed of its own for random augmentation (dynamic masking).

    The seed is derived from (seed, epoch, rank, batch index), so a resumed run draws the same masks as an
    uninterrupted one without saving any generator state, and DataLoader workers need no generator of their own.
    Yields `(seed, indices)`; incomplete last batches are dropped."""

    def __init__(self, sampler: ResumableRandomSampler, batch_size: int):
        if batch_size > len(sampler):
            raise ValueError(f"batch size {batch_size} is larger than the {len(sampler)} samples per rank and "
                             "epoch; lower the batch size")
        self.sampler, self.batch_size = sampler, batch_size

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def batch_seed(self, epoch: int, batch_index: int) -> int:
        entropy = [self.sampler.seed, epoch, self.sampler.rank, batch_index]
        return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        if self.sampler.position % self.batch_size:
            raise ValueError(f"sampler position {self.sampler.position} is not at a batch boundary "
                             f"(batch size {self.batch_size})")
        epoch, batch_index, indices = self.sampler.epoch, self.sampler.position // self.batch_size, []
        for index in self.sampler:
            indices.append(index)
            if len(indices) == self.batch_size:
                yield self.batch_seed(epoch, batch_index), indices
                batch_index, indices = batch_index + 1, []

    def state_dict(self, batches_consumed: int | None = None) -> dict:
        """The sampler's state; `batches_consumed` overrides its position for consumers that read ahead."""
        state = self.sampler.state_dict()
        if batches_consumed is not None:
            state["position"] = batches_consumed * self.batch_size
        return state

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def held_out_count(total: int, fraction: float, most: int) -> int:
    """How many of `total` instances validation holds out: `fraction` of them, at most `most`, and at least one, which
    the held-out loss, its curve and the learning summary need. Where `fraction` gives none (val_fraction=0) the one
    is said, not held out silently."""
    count = min(int(total * fraction), most)
    if count < 1:
        print(f"NOTE: val_fraction={fraction:g} of {total} instances holds out none; 1 is held out all the same, as "
              "the held-out loss, its curve and the learning summary need one", flush=True)
    return max(1, count)
