"""A multi-node run simulated on one machine: the data stages, with `ray.address` pointing at a Ray cluster of two
single-CPU nodes (ray.cluster_utils.Cluster, each node its own raylet and object store), spread their tasks over both
nodes, write to the shared `paths.cache_dir`, and give byte for byte what the same cluster gives with one node."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.engine.dag import StageContext
from pipeline.runner import run_pipeline
from tests.helpers import file_bytes, start_session_ray, tiny_config, write_books

DATA_STAGES = ("prepare", "bert_tokenizer", "bert_examples")
# Ray's smallest object store: the data stages of the test corpus pass a few MB through it
NODE = {"num_cpus": 1, "object_store_memory": 75 << 20}
# Written and timed by the engine on every run; everything else in a stage's directory is its output
RUN_RECORDS = {"stage.json", "stage.log", "_COMPLETE.json"}


@pytest.fixture
def make_cluster(monkeypatch):
    """Starts a Ray cluster whose nodes each have `node_args`, one node at first (`add_node` adds more); every process
    of it is stopped however the test ends."""
    import ray
    from ray.cluster_utils import Cluster

    # Cluster writes its address where a plain ray.init() on this machine looks for one (<temp>/ray/
    # ray_current_cluster): under the default /tmp, other people's local runs would join this test's cluster.
    temp_dir = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's unix sockets live under it
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    # A Ray this process already holds (the session's, which earlier tests started: ray_session) would take this
    # test's ray.init(address=...) and its runs, which keep a Ray they did not start: leave it, start it again after.
    had_session_ray = ray.is_initialized()
    ray.shutdown()
    started = []

    def make(**node_args):
        started.append(Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False}))
        return started[-1]

    try:
        yield make
    finally:
        ray.shutdown()
        for cluster in started:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if had_session_ray:
            monkeypatch.undo()  # RAY_TMPDIR: the session's Ray lives where it did before
            start_session_ray()


def _run_data_stages(tmp_path: Path, cluster, name: str) -> dict[str, Path]:
    """The data stages' outputs of a run on `cluster`, in a cache directory of its own."""
    cache, run = tmp_path / name / "cache", tmp_path / name / "run"
    cfg = tiny_config(tmp_path, [f"ray.address={cluster.address}", "pipeline.until=bert_examples",
                                 f"paths.cache_dir={cache}", f"paths.run_dir={run}"])
    run_pipeline(cfg)
    outputs = {stage: (run / stage).resolve() for stage in DATA_STAGES}
    for stage, out in outputs.items():
        assert out.parent.parent == cache / "stages" and (out / "_COMPLETE.json").is_file(), stage
    return outputs


def _start_a_worker_on_each(nodes: list[str]) -> None:
    """Connect to the cluster (the run that follows then joins this job, as run_pipeline keeps a Ray it did not start)
    and run one task on each node, so that each has a worker of this job waiting."""
    import ray

    node_id = ray.remote(lambda: ray.get_runtime_context().get_node_id())
    ran_on = [ray.get(node_id.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote())
              for n in nodes]
    assert ran_on == nodes


def _stage_json(out: Path) -> dict:
    return json.loads((out / "stage.json").read_text())


@pytest.mark.slow
def test_data_stages_spread_over_two_nodes_give_the_one_node_outputs(tmp_path, make_cluster):
    cluster = make_cluster(**NODE)
    # 24 books in the tiny config's 4 KB shards: 47 shard tasks
    write_books(tmp_path / "books", n_books=24)
    head = cluster.head_node.node_id
    one_node = _run_data_stages(tmp_path, cluster, "one_node")
    second = cluster.add_node(**NODE).node_id
    cluster.wait_for_nodes()
    # Ray's workers belong to one job (driver), and a run's first worker on a node takes 1-2 s to start, while the
    # head, which runs the stage tasks, has this job's workers already. The test corpus's 47 shard tasks take 0.7 s
    # in all: one warm worker on the head ran all of them before the second node's had started, in 3 runs of 4. With
    # a worker of the job waiting on each node, both nodes got shard tasks in 14 runs of 14. On a real
    # corpus a shard task takes seconds and a worker's start is soon repaid.
    import ray

    ray.init(address=cluster.address)
    _start_a_worker_on_each([head, second])
    two_nodes = _run_data_stages(tmp_path, cluster, "two_nodes")

    shards = _stage_json(one_node["bert_examples"])["shard_nodes"]
    assert len(shards) >= 8 and set(shards) == {head}
    shard_nodes = _stage_json(two_nodes["bert_examples"])["shard_nodes"]
    assert set(shard_nodes) == {head, second}, shard_nodes
    for stage in DATA_STAGES:
        assert _stage_json(two_nodes[stage])["node"] in {head, second}
    # each node's tasks wrote their shards' instances into the one cache directory
    for i in range(len(shard_nodes)):
        assert (two_nodes["bert_examples"] / f"examples-{i:05d}.arrow").is_file()

    for stage in DATA_STAGES:
        assert one_node[stage].name == two_nodes[stage].name  # the same work: the same content hash
        ours, theirs = file_bytes(one_node[stage]), file_bytes(two_nodes[stage])
        for records in (ours, theirs):
            for name in RUN_RECORDS:
                records.pop(name)
        assert ours == theirs, stage


def _node_of(index: int, shard: str) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _stage_on_the_head(tmp_path: Path) -> list[str]:
    """What a stage task on the head node gets from mapping two shards: the node of each."""
    ctx = StageContext(OmegaConf.create({}), "bert_examples", tmp_path)
    ctx.map_shards(_node_of, ["a", "b"])
    return [ctx.shard_nodes[i] for i in range(2)]


@pytest.mark.slow
def test_shard_tasks_use_every_node_even_when_the_stages_node_has_cpus_to_spare(tmp_path, make_cluster):
    import ray

    four_cpus = {**NODE, "num_cpus": 4}
    cluster = make_cluster(**four_cpus)
    head = cluster.head_node.node_id
    second = cluster.add_node(**four_cpus).node_id
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    on_the_head = NodeAffinitySchedulingStrategy(head, soft=False)
    nodes = ray.get(ray.remote(_stage_on_the_head).options(scheduling_strategy=on_the_head).remote(tmp_path))
    assert sorted(nodes) == sorted([head, second])  # Ray's default policy ran both on the head
