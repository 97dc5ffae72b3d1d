"""map_shards: one single-CPU Ray task per shard, results in shard order whatever order the tasks finish in."""
from __future__ import annotations

import time

from pipeline.engine.shard_tasks import map_shards


def _describe(index: int, shard: str, suffix: str, delay_s: float) -> dict:
    import ray

    time.sleep(delay_s * (2 - index))  # later shards finish first, the first shard last
    context = ray.get_runtime_context()
    return {"out": f"{index}:{shard}{suffix}", "task": context.get_task_id(),
            "cpus": context.get_assigned_resources().get("CPU")}


def test_map_shards_runs_one_one_cpu_task_per_shard_and_keeps_shard_order(ray_session):
    results = map_shards(_describe, ["a", "b", "c"], ".arrow", delay_s=0.3)
    assert [r["out"] for r in results] == ["0:a.arrow", "1:b.arrow", "2:c.arrow"]
    assert len({r["task"] for r in results}) == 3 and None not in {r["task"] for r in results}
    assert [r["cpus"] for r in results] == [1.0] * 3
