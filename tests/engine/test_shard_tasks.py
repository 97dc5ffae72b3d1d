"""Shard tasks: one single-CPU Ray task per shard, results in shard order whatever order the tasks finish in (or as
they finish, for a fold), and the node of each recorded for the stage's summary."""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.corpus import prepare_workers
from pipeline.engine.dag import StageContext, stage_placement
from pipeline.engine.settings import RayConfig


def _describe(index: int, shard: str, suffix: str, delay_s: float) -> dict:
    import ray

    time.sleep(delay_s * (2 - index))  # later shards finish first, the first shard last
    context = ray.get_runtime_context()
    return {"out": f"{index}:{shard}{suffix}", "task": context.get_task_id(),
            "cpus": context.get_assigned_resources().get("CPU")}


def test_map_shards_runs_one_one_cpu_task_per_shard_and_keeps_shard_order(ray_session, tmp_path):
    import ray

    ctx = StageContext(OmegaConf.create({}), "bert_examples", tmp_path)
    results = ctx.map_shards(_describe, ["a", "b", "c"], ".arrow", delay_s=0.3)
    assert [r["out"] for r in results] == ["0:a.arrow", "1:b.arrow", "2:c.arrow"]
    assert len({r["task"] for r in results}) == 3 and None not in {r["task"] for r in results}
    assert [r["cpus"] for r in results] == [1.0] * 3
    # stage.json says which node wrote each shard: here the one node there is
    node = ray.get_runtime_context().get_node_id()
    assert stage_placement(ctx) == {"node": node, "shard_nodes": [node] * 3}


def _released(index: int, shard: str, release: Path, timeout_s: float) -> bool:
    """Shard 0 at once; the others once `release` exists: whether it did within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while index and not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return release.exists()


def test_shard_results_hands_over_each_result_while_other_shards_still_run(ray_session, tmp_path):
    """A fold over the results (skip_thought_vocab's word counts) holds one shard's result at a time, not all."""
    ctx = StageContext(OmegaConf.create({}), "skip_thought_vocab", tmp_path)
    release = tmp_path / "release"
    results = ctx.shard_results(_released, ["a", "b"], release, timeout_s=60)
    assert next(results) == (0, False)  # while shard 1's task waits for the caller to release it
    release.touch()
    assert list(results) == [(1, True)]
    assert sorted(ctx.shard_nodes) == [0, 1]


def test_prepare_keeps_every_cpu_of_the_running_ray_busy_not_ray_num_cpus(ray_session):
    # ray_session has 2 CPUs; on a cluster ray.num_cpus is one training stage's share
    assert prepare_workers(RayConfig(num_cpus=1)) == 2
