"""`python -m pipeline.status`: every stage state read back from what the engine really writes."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline import status
from pipeline.engine.dag import Stage, StageFailed, run_dag


def produce(ctx) -> dict:
    (ctx.out_dir / "data.bin").write_bytes(b"x" * 5000)
    return {}


def consume(ctx) -> dict:
    if ctx.cfg.fail:
        raise ValueError("consume is broken on purpose")
    return {"size": (ctx.stage_dir("produce") / "data.bin").stat().st_size}


def finish(ctx) -> dict:
    return {}


STAGES = {s.name: s for s in [Stage("produce", produce), Stage("consume", consume, ("produce",), ("fail",)),
                               Stage("finish", finish, ("consume",))]}


def _cfg(tmp_path: Path, fail: bool):
    return OmegaConf.create({"fail": fail, "logger": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
                             "paths": {"cache_dir": str(tmp_path / "cache")},
                             "pipeline": {"stages": list(STAGES), "until": None, "force": [], "dry_run": False}})


def _states(run_dir: Path) -> dict[str, str]:
    return {s.name: s.state for s in status.read_status(run_dir)}


def test_a_failed_run_then_its_rerun(tmp_path, ray_session):
    with pytest.raises(StageFailed):
        run_dag(_cfg(tmp_path, fail=True), STAGES, tmp_path / "run1")
    by_name = {s.name: s for s in status.read_status(tmp_path / "run1")}
    assert {n: s.state for n, s in by_name.items()} == {"produce": "complete", "consume": "failed",
                                                        "finish": "not run"}
    assert by_name["produce"].size_bytes >= 5000 and by_name["produce"].duration_s is not None
    assert by_name["finish"].size_bytes is None and by_name["finish"].duration_s is None
    table = status.format_table(tmp_path / "run1", list(by_name.values()))
    assert f"consume failed: see {by_name['consume'].log}" in table
    produce_row = next(line for line in table.splitlines() if line.startswith("produce"))
    assert by_name["produce"].hash in produce_row and status.human_bytes(by_name["produce"].size_bytes) in produce_row

    run_dag(_cfg(tmp_path, fail=False), STAGES, tmp_path / "run2")
    assert _states(tmp_path / "run2") == {"produce": "cached", "consume": "complete", "finish": "complete"}


def test_a_failed_stage_is_failed_in_pipeline_json_and_in_the_exit_status(tmp_path, ray_session, capsys):
    with pytest.raises(StageFailed):
        run_dag(_cfg(tmp_path, fail=True), STAGES, tmp_path / "failed")
    recorded = json.loads((tmp_path / "failed" / status.PIPELINE_FILE).read_text())["stages"]
    assert {name: stage["state"] for name, stage in recorded.items()} == {
        "produce": "ran", "consume": "failed", "finish": "not run"}
    assert status.main([str(tmp_path / "failed")]) == 1
    run_dag(_cfg(tmp_path, fail=False), STAGES, tmp_path / "fixed")
    assert status.main([str(tmp_path / "fixed")]) == 0


def test_a_held_lock_is_running_and_a_start_without_end_is_interrupted(tmp_path, ray_session):
    with pytest.raises(StageFailed):
        run_dag(_cfg(tmp_path, fail=True), STAGES, tmp_path / "run")
    consume = next(s for s in status.read_status(tmp_path / "run") if s.name == "consume")
    # What a second attempt that was then SIGKILLed leaves: its start line, no traceback, no marker.
    with open(consume.log, "a") as log:
        log.write(f"stage consume: running ({consume.hash}) → {consume.output}\n")
    with open(consume.output.parent / f"{consume.hash}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the engine holds this while the stage executes
        assert _states(tmp_path / "run")["consume"] == "running"
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert _states(tmp_path / "run")["consume"] == "interrupted"
    assert status.main([str(tmp_path / "run")]) == 1
    assert "consume interrupted: see" in status.format_table(tmp_path / "run", status.read_status(tmp_path / "run"))


def test_without_an_argument_the_newest_run_is_shown(tmp_path, ray_session, monkeypatch, capsys):
    for name in ("older", "newer"):
        run_dag(_cfg(tmp_path, fail=False), STAGES, tmp_path / "outputs" / "exp" / name)
    older = tmp_path / "outputs" / "exp" / "older" / status.PIPELINE_FILE
    os.utime(older, (older.stat().st_atime, older.stat().st_mtime - 60))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # the runs' own output
    assert status.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run: {Path('outputs') / 'exp' / 'newer'}\n")
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["stage", "state"], ["produce", "cached"], ["consume", "cached"], ["finish", "cached"]]


def test_missing_run_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert status.main([]) == 1
    assert "run the pipeline first" in capsys.readouterr().err
    assert status.main([str(tmp_path)]) == 1
    assert "pass the directory that `python -m pipeline` printed" in capsys.readouterr().err


def test_sizes_and_durations_read_like_units():
    assert [status.human_bytes(n) for n in (999, 5000, 2_500_000, 3_000_000_000)] == \
        ["999 B", "5.0 KB", "2.5 MB", "3.0 GB"]
    assert [status.human_duration(s) for s in (4.3, 125, 7384)] == ["4.3 s", "2m05s", "2h03m"]


def test_a_relative_cache_directory_gives_a_run_whose_stages_are_linked_and_complete(tmp_path, ray_session,
                                                                                      monkeypatch):
    """Issue 39, defect 6: with paths.cache_dir=relcache the run directory's links were relative and dangled: every
    stage succeeded, then the driver failed with exit 1 and `pipeline.status` said 'not run'."""
    from pipeline.runner import run_pipeline
    from tests.helpers import tiny_config

    monkeypatch.chdir(tmp_path)
    run_dir = run_pipeline(tiny_config(tmp_path, ["pipeline.until=prepare", "paths.cache_dir=relcache"]))
    (prepare,) = status.read_status(run_dir)
    assert prepare.state == "complete"
    assert (run_dir / "prepare").resolve() == prepare.output == tmp_path / "relcache/stages/prepare" / prepare.hash


def test_a_truncated_stage_json_or_pipeline_json_gives_a_message_not_a_traceback(tmp_path, ray_session, capsys):
    """Issue 39, defect 8: a truncated stage.json crashed `pipeline.status` with a traceback."""
    run_dag(_cfg(tmp_path, fail=False), STAGES, tmp_path / "run")
    produced = status.read_status(tmp_path / "run")[0].output
    (produced / "stage.json").write_text('{"stage": "produce", "dura')
    assert status.main([str(tmp_path / "run")]) == 0
    assert status.main([str(tmp_path / "run"), "--verify"]) == 1
    assert "stage.json has 26 bytes where the stage wrote" in capsys.readouterr().out
    (tmp_path / "run" / "pipeline.json").write_text('{"stages": {"produce": {"hash"')
    assert status.main([str(tmp_path / "run")]) == 1
    assert "pipeline.json is not a readable pipeline file (truncated or damaged)" in capsys.readouterr().err


@pytest.mark.parametrize("stages", [{"produce": {"hash": "0123"}}, {"produce": "x"}, ["produce"]],
                         ids=["no-output", "not-a-mapping", "a-list"])
def test_a_pipeline_json_of_another_shape_gives_a_message_not_a_traceback(tmp_path, capsys, stages):
    """A pipeline.json that parses but is not what run_dag writes: KeyError 'output' or TypeError tracebacks."""
    (tmp_path / "pipeline.json").write_text(json.dumps({"stages": stages}))
    assert status.main([str(tmp_path)]) == 1
    assert "pipeline.json is not a readable pipeline file (truncated or damaged)" in capsys.readouterr().err


def test_a_finished_stage_deleted_from_the_cache_is_deleted_not_not_run(tmp_path, ray_session, capsys):
    """A finished run whose stage output was removed from the cache: 'not run', exit 0, and `--verify` said all of
    the run's other stages were verified."""
    run_dag(_cfg(tmp_path, fail=False), STAGES, tmp_path / "run")
    consumed = next(s for s in status.read_status(tmp_path / "run") if s.name == "consume")
    shutil.rmtree(consumed.output)
    assert _states(tmp_path / "run") == {"produce": "complete", "consume": "deleted", "finish": "complete"}
    assert status.main([str(tmp_path / "run"), "--verify"]) == 1
    assert (f"consume deleted: the run finished it, and its output {consumed.output} is gone from the cache; rerun "
            "the same command to make it again") in capsys.readouterr().out


def peek(ctx) -> dict:
    """What `python -m pipeline.status` would read of the run while this stage runs: as a SIGKILL would leave it."""
    (ctx.out_dir / "seen.json").write_text((ctx.run_dir / "pipeline.json").read_text())
    return {}


def test_a_run_whose_driver_was_killed_is_interrupted_and_its_reused_stages_cached(tmp_path, ray_session, capsys):
    """Issue 39, defect 9: after the driver was SIGKILLed, pipeline.json was left as first written, every stage 'not
    run', so pipeline.status called a stage reused from the cache 'complete' and, exit 0, said nothing of the run
    having been killed."""
    stages = {s.name: s for s in [Stage("produce", produce), Stage("peek", peek, ("produce",))]}
    cfg = _cfg(tmp_path, fail=False)
    cfg.pipeline.stages = ["peek"]
    run_dag(cfg, stages, tmp_path / "run1")
    cfg.pipeline.force = ["peek"]
    run_dag(cfg, stages, tmp_path / "run2")
    mid_run = json.loads((tmp_path / "run2" / "peek" / "seen.json").read_text())
    assert mid_run["stages"]["produce"]["state"] == "cached" and mid_run["ended"] is False
    assert mid_run["driver"]["pid"] == os.getpid()
    assert status.main([str(tmp_path / "run2")]) == 0  # ended: its last write says so
    assert "run interrupted" not in capsys.readouterr().out

    dead = subprocess.Popen(["true"])
    dead.wait()
    mid_run["driver"] |= {"pid": dead.pid, "started": "1"}  # as the killed driver left it
    (tmp_path / "run2" / "pipeline.json").write_text(json.dumps(mid_run))
    assert status.main([str(tmp_path / "run2")]) == 1
    out = capsys.readouterr().out
    assert f"run interrupted: its driver (pid {dead.pid}) ended without finishing the run" in out
    assert {s.name: s.state for s in status.read_status(tmp_path / "run2")}["produce"] == "cached"
