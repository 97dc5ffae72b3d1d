"""The data stages' one use of Ray inside a stage: a pure per-shard function mapped over the sentence shards, one
single-CPU task per shard (google-research/bert's README has create_pretraining_data.py run once per shard of the
input). The functions take their randomness as an explicit seed, so the output does not depend on which worker ran
which shard."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def map_shards(fn: Callable[..., T], shards: Sequence, *args, **kwargs) -> list[T]:
    """[fn(i, shard, *args, **kwargs) for i, shard in enumerate(shards)], each call one Ray task holding one CPU,
    all submitted at once; results in shard order. `i` names the shard's output file and seeds its randomness."""
    import ray

    task = ray.remote(fn).options(num_cpus=1)
    return ray.get([task.remote(i, shard, *args, **kwargs) for i, shard in enumerate(shards)])
