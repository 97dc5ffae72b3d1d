"""The data stages' one use of Ray inside a stage: a pure per-shard function mapped over the sentence shards, one
single-CPU task per shard (google-research/bert's README has create_pretraining_data.py run once per shard of the
input). The functions take their randomness as an explicit seed, so the output does not depend on which worker ran
which shard, nor on which node.

The tasks are scheduled SPREAD rather than by Ray's default policy, which keeps a task on the submitting node (the
stage's) while fewer than half of that node's CPUs are busy: on a ray.cluster_utils cluster of two 4-CPU nodes, a
stage's two shard tasks both ran on the stage's node by default, one on each node with SPREAD. A shard task's
arguments are paths, not objects, so keeping it next to its submitter saves nothing; on a cluster, spreading shares
out the tasks' memory and their traffic to and from the shared `paths.cache_dir`.
With more shards than half the CPUs, both policies use every node; on one machine they place the tasks alike."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def _on_node(fn: Callable[..., T], *args, **kwargs) -> tuple[T, str]:
    import ray

    return fn(*args, **kwargs), ray.get_runtime_context().get_node_id()


def shard_results(fn: Callable[..., T], shards: Sequence, *args, **kwargs) -> Iterator[tuple[int, T, str]]:
    """(i, fn(i, shard, *args, **kwargs), id of the Ray node that ran it) for each shard, as the tasks finish: one
    single-CPU task per shard, all submitted at once. `i` names the shard's output file and seeds its randomness.
    A result is handed over as soon as its task ends, so a caller that folds the results as they come (a word count)
    holds one at a time, not one per shard."""
    import ray

    task = ray.remote(_on_node).options(num_cpus=1, scheduling_strategy="SPREAD", name=fn.__name__)
    index = {task.remote(fn, i, shard, *args, **kwargs): i for i, shard in enumerate(shards)}
    pending = list(index)
    while pending:
        (ref,), pending = ray.wait(pending, num_returns=1)
        result, node = ray.get(ref)
        yield index.pop(ref), result, node

