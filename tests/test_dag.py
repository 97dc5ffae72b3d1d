"""The workflow engine: content-addressed caching, reruns of exactly what changed, force/until/dry-run,
failures that leave no marker, and concurrent runs that share work instead of corrupting it."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.engine.dag import MARKER, Stage, StageFailed, execute_stage, plan, run_dag, stage_hashes
from pipeline.stages import STAGES
from tests.helpers import tiny_config


def _record(ctx, label: str) -> None:
    log = Path(ctx.cfg.paths.cache_dir) / "executions.log"
    with open(log, "a") as f:
        f.write(f"{label}\n")


def source(ctx) -> dict:
    _record(ctx, "source")
    (ctx.out_dir / "value.txt").write_text(str(ctx.cfg.a))
    return {"value": ctx.cfg.a}


def double(ctx) -> dict:
    _record(ctx, "double")
    value = int((ctx.stage_dir("source") / "value.txt").read_text()) * 2 * ctx.cfg.b
    (ctx.out_dir / "value.txt").write_text(str(value))
    return {"value": value}


def sink(ctx) -> dict:
    _record(ctx, "sink")
    if ctx.cfg.fail:
        print("about to fail")
        raise ValueError("the sink is broken")
    return {"value": int((ctx.stage_dir("double") / "value.txt").read_text()) + 1}


def slow(ctx) -> dict:
    _record(ctx, "slow")
    time.sleep(1.0)
    return {}


FAKE = {s.name: s for s in [Stage("source", source, (), ("a",)), Stage("double", double, ("source",), ("b",)),
                             Stage("sink", sink, ("double",), ("fail",)), Stage("slow", slow, (), ())]}


def _cfg(tmp_path: Path, **overrides):
    cfg = OmegaConf.create({"a": 3, "b": 1, "fail": False, "logger": {"kind": "csv"},
                            "paths": {"cache_dir": str(tmp_path / "cache")},
                            "pipeline": {"stages": ["source", "double", "sink"], "until": None, "force": [],
                                         "dry_run": False}})
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def _executions(tmp_path: Path) -> list[str]:
    log = tmp_path / "cache" / "executions.log"
    return log.read_text().split() if log.exists() else []


def test_changing_a_pretraining_key_changes_pretraining_and_downstream_hashes_only(tmp_path):
    base = tiny_config(tmp_path)
    changed = tiny_config(tmp_path, ["pretrain.lr=5e-4"])
    names = plan(base, STAGES).order  # the stages of this experiment's run
    assert names == ["prepare", "tokenizer", "examples", "pretrain", "finetune", "report"]
    a, b = stage_hashes(base, STAGES, names), stage_hashes(changed, STAGES, names)
    assert [n for n in names if a[n] != b[n]] == ["pretrain", "finetune", "report"]
    logger_only = tiny_config(tmp_path, ["logger=wandb"])
    assert stage_hashes(logger_only, STAGES, names) == a  # tracking does not change what a stage computes


def test_second_run_reuses_every_stage_and_a_change_reruns_only_downstream(tmp_path, ray_session, capsys):
    first = run_dag(_cfg(tmp_path), FAKE, tmp_path / "run1")
    assert {n: r["state"] for n, r in first.items()} == {"source": "ran", "double": "ran", "sink": "ran"}
    second = run_dag(_cfg(tmp_path), FAKE, tmp_path / "run2")
    assert {r["state"] for r in second.values()} == {"cached"}
    assert "stage sink: cached (" in capsys.readouterr().out
    assert (tmp_path / "run2" / "sink").resolve() == (tmp_path / "run1" / "sink").resolve()
    third = run_dag(_cfg(tmp_path, b=5), FAKE, tmp_path / "run3")
    assert {n: r["state"] for n, r in third.items()} == {"source": "cached", "double": "ran", "sink": "ran"}
    assert third["sink"]["value"] == 3 * 2 * 5 + 1
    assert _executions(tmp_path) == ["source", "double", "sink", "double", "sink"]


def test_force_reruns_the_stage_and_its_downstream_until_stops_early(tmp_path, ray_session):
    run_dag(_cfg(tmp_path), FAKE, tmp_path / "run1")
    left_over = (tmp_path / "run1" / "double").resolve() / "checkpoint"  # what a resuming stage would continue from
    left_over.write_text("step 1000")
    forced = run_dag(_cfg(tmp_path, **{"pipeline.force": ["double"]}), FAKE, tmp_path / "run2")
    assert {n: r["state"] for n, r in forced.items()} == {"source": "cached", "double": "ran", "sink": "ran"}
    assert not left_over.exists()  # a forced stage starts from scratch
    partial = run_dag(_cfg(tmp_path, a=7, **{"pipeline.until": "double"}), FAKE, tmp_path / "run3")
    assert set(partial) == {"source", "double"}


def test_dry_run_prints_the_dag_with_cached_and_pending_state(tmp_path, ray_session):
    run_dag(_cfg(tmp_path, **{"pipeline.until": "source"}), FAKE, tmp_path / "run1")
    description = plan(_cfg(tmp_path), FAKE).describe()
    lines = description.splitlines()
    assert lines[1].startswith("source") and "cached" in lines[1]
    assert lines[2].startswith("double") and "pending" in lines[2] and "source →" in lines[2]


def test_a_failing_stage_leaves_no_marker_and_names_itself_and_its_log(tmp_path, ray_session):
    with pytest.raises(StageFailed, match=r"stage sink failed: ValueError: the sink is broken \(full log: ") as err:
        run_dag(_cfg(tmp_path, fail=True), FAKE, tmp_path / "run1")
    the_plan = plan(_cfg(tmp_path, fail=True), FAKE)
    sink_dir = the_plan.dirs["sink"]
    assert not (sink_dir / MARKER).exists()
    log = (sink_dir / "stage.log").read_text()
    assert "about to fail" in log and "Traceback" in log and str(sink_dir / "stage.log") in str(err.value)
    assert (the_plan.dirs["double"] / MARKER).exists()  # finished upstream work is kept


def test_concurrent_runs_share_one_execution(tmp_path):
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["slow"]})
    the_plan = plan(cfg, FAKE)
    results = []

    def run() -> None:
        results.append(execute_stage(FAKE, cfg, "slow", the_plan.hashes["slow"], the_plan.dirs["slow"], {}, None))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["state"] for r in results) == ["cached", "ran"]
    assert _executions(tmp_path) == ["slow"]


def threads(ctx) -> dict:
    import torch

    _record(ctx, f"{ctx.name}:{torch.get_num_threads()}")
    return {}


def test_each_stage_runs_torch_on_the_cpus_it_was_granted(tmp_path, ray_session):
    """Ray reuses worker processes, and torch keeps the thread pool of the first task that imported it: a stage
    granted two CPUs after a one-CPU stage must still get two threads."""
    stages = {s.name: s for s in [Stage("one", threads, (), (), num_cpus=lambda cfg: 1),
                                  Stage("two", threads, ("one",), (), num_cpus=lambda cfg: 2)]}
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["one", "two"]})
    run_dag(cfg, stages, tmp_path / "run")
    assert _executions(tmp_path) == ["one:1", "two:2"]
