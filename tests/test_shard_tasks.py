"""Shard tasks: one single-CPU Ray task per shard, results in shard order whatever order the tasks finish in, and the
node of each recorded for the stage's summary."""
from __future__ import annotations

import time

from omegaconf import OmegaConf

from pipeline.corpus import prepare_workers
from pipeline.engine.dag import StageContext, stage_placement


def _describe(index: int, shard: str, suffix: str, delay_s: float) -> dict:
    import ray

    time.sleep(delay_s * (2 - index))  # later shards finish first, the first shard last
    context = ray.get_runtime_context()
    return {"out": f"{index}:{shard}{suffix}", "task": context.get_task_id(),
            "cpus": context.get_assigned_resources().get("CPU")}


def test_map_shards_runs_one_one_cpu_task_per_shard_and_keeps_shard_order(ray_session, tmp_path):
    import ray

    ctx = StageContext(OmegaConf.create({}), "examples", tmp_path)
    results = ctx.map_shards(_describe, ["a", "b", "c"], ".arrow", delay_s=0.3)
    assert [r["out"] for r in results] == ["0:a.arrow", "1:b.arrow", "2:c.arrow"]
    assert len({r["task"] for r in results}) == 3 and None not in {r["task"] for r in results}
    assert [r["cpus"] for r in results] == [1.0] * 3
    # stage.json says which node wrote each shard: here the one node there is
    node = ray.get_runtime_context().get_node_id()
    assert stage_placement(ctx) == {"node": node, "shard_nodes": [node] * 3}


def test_prepare_keeps_every_cpu_of_the_running_ray_busy_not_ray_num_cpus(ray_session):
    # ray_session has 2 CPUs; on a cluster ray.num_cpus is one training stage's share
    assert prepare_workers(OmegaConf.create({"ray": {"num_cpus": 1}})) == 2
