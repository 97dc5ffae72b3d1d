"""The workflow engine: content-addressed caching, reruns of exactly what changed, force/until/dry-run,
failures that leave no marker, and concurrent runs that share work instead of corrupting it."""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from omegaconf import OmegaConf

from pipeline.engine import fingerprints
from pipeline.engine.dag import (
    MARKER,
    Stage,
    StageFailed,
    _config_subset,
    check_outputs_intact,
    execute_stage,
    plan,
    run_dag,
    stage_hashes,
)
from pipeline.engine.stage_log import captured_output
from pipeline.stages import STAGES
from tests.helpers import TinyRun, tiny_config


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
    cfg = OmegaConf.create({"a": 3, "b": 1, "fail": False,
                            "logger": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
                            "paths": {"cache_dir": str(tmp_path / "cache")},
                            "pipeline": {"stages": ["source", "double", "sink"], "until": None, "force": [],
                                         "dry_run": False}})
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def _executions(tmp_path: Path) -> list[str]:
    log = tmp_path / "cache" / "executions.log"
    return log.read_text().split() if log.exists() else []


@pytest.mark.parametrize("override", [
    "pretrain.lr=5e-4", "pretrain.encoder_snapshots=[10]",
    # any Trainer argument, a callback (EarlyStopping changes what is trained) and a debug option change results
    "+trainer.limit_train_batches=5", "callbacks=lr_monitor", "+debug=fdr", "trainer=ddp_cpu"])
def test_changing_a_pretraining_key_changes_pretraining_and_downstream_hashes_only(tmp_path, override):
    base = tiny_config(tmp_path)
    changed = tiny_config(tmp_path, [override])
    names = plan(base, STAGES).order  # the stages of this experiment's run
    assert names == ["prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "word2vec", "finetune", "report"]
    a, b = stage_hashes(base, STAGES, names), stage_hashes(changed, STAGES, names)
    assert [n for n in names if a[n] != b[n]] == ["bert_pretrain", "finetune", "report"]
    logger_only = tiny_config(tmp_path, ["logger=wandb"])
    assert stage_hashes(logger_only, STAGES, names) == a  # tracking does not change what a stage computes


def test_finetune_depends_on_the_trainer_arguments_it_applies_and_not_on_the_multi_process_ones(tmp_path):
    """Fine-tuning trains in one process, so trainer=ddp_cpu (strategy, devices) leaves its own key unchanged; a
    Trainer argument it passes on (limit_train_batches) changes it."""
    def finetune_key(overrides: list[str]) -> dict:
        cfg = tiny_config(tmp_path, overrides)
        return _config_subset(cfg, STAGES["finetune"].config_keys(cfg))

    base = finetune_key([])
    assert finetune_key(["trainer=ddp_cpu"]) == base
    assert finetune_key(["+trainer.limit_train_batches=5"]) != base


def test_an_edit_to_a_task_yaml_alone_changes_the_stages_that_read_the_task(tmp_path, monkeypatch):
    """A task's YAML says how it is read and scored (columns, labels, metric, a generation task's beams): editing it
    with its data unchanged reruns fine-tuning, and prepare where it changes the texts (decontamination reads the
    task's dev split), not where it changes only the scoring."""
    from pipeline.downstream import tasks

    cfg = tiny_config(tmp_path)
    names = plan(cfg, STAGES).order
    before = stage_hashes(cfg, STAGES, names)
    for source in tasks.TASK_DIR.glob("*.yaml"):
        (tmp_path / "tasks" / source.name).parent.mkdir(exist_ok=True)
        (tmp_path / "tasks" / source.name).write_text(source.read_text())
    monkeypatch.setattr(tasks, "TASK_DIR", tmp_path / "tasks")
    assert stage_hashes(cfg, STAGES, names) == before  # the same definitions, read from elsewhere
    edited = tmp_path / "tasks" / f"{tasks.task_names(cfg.finetune.task)[0]}.yaml"
    text = edited.read_text()
    assert re.search(r"^metric: (?!f1\n)", text, re.M)
    edited.write_text(re.sub(r"^metric: .*$", "metric: f1", text, count=1, flags=re.M))  # how it is scored
    scored = stage_hashes(cfg, STAGES, names)
    assert [n for n in names if scored[n] != before[n]] == ["finetune", "report"]
    edited.write_text(re.sub(r"^text_a: .*$", "text_a: other", edited.read_text(), count=1, flags=re.M))  # its texts
    read = stage_hashes(cfg, STAGES, names)
    assert "prepare" in names and {n for n in names if read[n] != scored[n]} == set(names)  # all read prepare's


def test_books_behind_a_linked_folder_and_in_upper_case_are_in_the_prepare_hash(tmp_path):
    cfg = tiny_config(tmp_path)
    hashes = [stage_hashes(cfg, STAGES, ["prepare"])["prepare"]]
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (shelf / "linked.txt").write_text("A book on a shelf linked into the corpus.\n")
    (tmp_path / "books" / "shelf").symlink_to(shelf, target_is_directory=True)
    (shelf / "back").symlink_to(tmp_path / "books", target_is_directory=True)  # a loop
    hashes.append(stage_hashes(cfg, STAGES, ["prepare"])["prepare"])
    (shelf / "linked.txt").write_text("The linked book, rewritten to a different length.\n")
    hashes.append(stage_hashes(cfg, STAGES, ["prepare"])["prepare"])
    (tmp_path / "books" / "SHOUTED.TXT").write_text("A book whose name is in capitals.\n")
    hashes.append(stage_hashes(cfg, STAGES, ["prepare"])["prepare"])
    assert len(set(hashes)) == 4, hashes


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


def flaky(ctx) -> dict:
    _record(ctx, "flaky")
    if ctx.cfg.flaky_fails:  # not among its config keys: the same stage, hash and output directory either way
        raise OSError("the disk went away")
    return {}


def after_flaky(ctx) -> dict:
    _record(ctx, "after")
    (ctx.out_dir / "result.txt").write_text("finished")
    return {}


def test_force_removes_an_output_only_when_its_replacement_starts(tmp_path, ray_session):
    """pipeline.force used to delete every forced output before the run began: an earlier stage failing (or a run
    that never got going) lost the finished work of the stages after it."""
    stages = {s.name: s for s in [Stage("flaky", flaky), Stage("after", after_flaky, ("flaky",))]}
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["after"], "flaky_fails": False})
    run_dag(cfg, stages, tmp_path / "run1")
    finished = plan(cfg, stages).dirs["after"]
    with pytest.raises(StageFailed, match="stage flaky failed: OSError: the disk went away"):
        run_dag(_cfg(tmp_path, **{"pipeline.stages": ["after"], "pipeline.force": ["flaky"], "flaky_fails": True}),
                stages, tmp_path / "run2")
    assert (finished / MARKER).is_file() and (finished / "result.txt").read_text() == "finished"
    assert _executions(tmp_path) == ["flaky", "after", "flaky"]


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


def remove_the_run_directory(ctx) -> dict:
    shutil.rmtree(ctx.run_dir)  # the user's `rm -rf` of the run directory while the run goes on
    (ctx.out_dir / "value.txt").write_text("7")
    return {}


def test_a_run_directory_removed_mid_run_is_said_in_one_line_and_the_cache_kept(tmp_path, ray_session):
    """The driver's next write into the removed run directory (a stage's link, then
    pipeline.json in the `finally` that was to record the run's end) failed with a FileNotFoundError traceback."""
    stages = {**FAKE, "remover": Stage("remover", remove_the_run_directory, ("source",))}
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["remover"]})
    with pytest.raises(StageFailed) as err:
        run_dag(cfg, stages, tmp_path / "run1")
    assert re.fullmatch(rf"the run directory {tmp_path / 'run1'} was removed while the run was going; the stages "
                        rf"that finished are kept in the cache \(paths.cache_dir={tmp_path / 'cache'}\): rerun the "
                        r"same command, which reuses them", str(err.value))
    assert err.value.__context__ is None or err.value.__suppress_context__
    assert run_dag(cfg, stages, tmp_path / "run2")["remover"]["state"] == "cached"


def test_private_books_give_a_cache_readable_by_its_owner_alone(tmp_path, ray_session, monkeypatch):
    """Books at mode 600 became shards at mode 644 in a directory at 755 under the default umask,
    readable by every user of the machine (and by anyone a copy of the cache went to)."""
    monkeypatch.setattr(fingerprints, "SETTLE_NS", 0)  # the books' digests are memoised at once
    previous_umask = os.umask(0o022)
    try:
        cfg = tiny_config(tmp_path, ["pipeline.until=prepare"])
        for book in Path(cfg.data.corpus_dir).iterdir():
            book.chmod(0o600)
        run = TinyRun(cfg)
        run.run_stage("prepare")
    finally:
        os.umask(previous_umask)
    out_dir = run.stage_dir("prepare")
    assert out_dir.stat().st_mode & 0o777 == 0o700
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out_dir.rglob("*")}
    assert modes and {name for name, mode in modes.items() if int(mode, 8) & 0o077} == set(), modes
    assert (tmp_path / "cache" / "file_digests").stat().st_mode & 0o777 == 0o700  # it names the books
    check_outputs_intact({"prepare": out_dir})  # the modes its marker records are the private ones


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


def fill_with_bytes(ctx) -> dict:
    print("x" * 4000)  # the log's page nearly used: printing the traceback needs space the disk no longer has
    (ctx.out_dir / "big.bin").write_bytes(b"x" * (2 << 20))
    return {}


def fill_with_torch_save(ctx) -> dict:
    import torch

    torch.save(torch.zeros(1 << 19), ctx.out_dir / "big.pt")  # a full disk is a RuntimeError about "unexpected pos"
    return {}


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, where the test may mount one; test_a_full_disk_in_a_patched_writer_names_the_cache_directory
    checks the message everywhere."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                                                   capture_output=True).returncode:
        pytest.skip("cannot mount a size-limited tmpfs here (needs root)")
    yield mount_point
    subprocess.run(["umount", "--lazy", str(mount_point)], check=True)  # torch may still hold its file open


@pytest.mark.parametrize("fill, says", [
    (fill_with_bytes, "no space left on device: the cache directory paths.cache_dir={} is full ("),
    (fill_with_torch_save, "perhaps for want of space: the cache directory paths.cache_dir={} is full ("),
], ids=["write_bytes", "torch.save"])
def test_a_full_disk_names_the_cache_directory(small_disk, fill, says):
    cache_dir = small_disk / "cache"
    cfg = _cfg(small_disk, **{"paths.cache_dir": str(cache_dir), "pipeline.stages": ["fill"]})
    stages = {"fill": Stage("fill", fill)}
    the_plan = plan(cfg, stages)
    with pytest.raises(StageFailed) as err:
        execute_stage(stages, cfg, "fill", the_plan.hashes["fill"], the_plan.dirs["fill"], {}, None)
    assert says.format(cache_dir) in str(err.value)
    assert "set paths.cache_dir to a bigger disk, then rerun the same command" in str(err.value)
    assert not (the_plan.dirs["fill"] / MARKER).exists()


def save_a_checkpoint(ctx) -> dict:
    import torch

    from pipeline.engine.checkpoints import AtomicCheckpointIO

    AtomicCheckpointIO(keep=2).save_checkpoint({"weights": torch.zeros(1 << 19)},
                                               ctx.out_dir / "checkpoints" / "step-00000010.ckpt")
    return {}


def test_a_checkpoint_that_does_not_fit_leaves_no_temporary_and_names_the_cache_directory(small_disk):
    """Issue 39, defect 4: a failed checkpoint save left its temporary file (7.6 MB on a 20 MiB volume; each rerun
    added another), and the error was torch's 'unexpected pos'."""
    cache_dir = small_disk / "cache"
    cfg = _cfg(small_disk, **{"paths.cache_dir": str(cache_dir), "pipeline.stages": ["save"]})
    stages = {"save": Stage("save", save_a_checkpoint)}
    the_plan = plan(cfg, stages)
    with pytest.raises(StageFailed, match=re.escape(f"stage save failed: no space left on device: the cache directory "
                                                    f"paths.cache_dir={cache_dir} is full (")):
        execute_stage(stages, cfg, "save", the_plan.hashes["save"], the_plan.dirs["save"], {}, None)
    assert [p.name for p in (the_plan.dirs["save"] / "checkpoints").iterdir()] == []


@pytest.mark.parametrize("free, raised", [(0, OSError), (10 << 30, RuntimeError)], ids=["full", "not-full"])
def test_a_failed_checkpoint_save_removes_its_temporary(tmp_path, monkeypatch, free, raised):
    """The same on any machine (no tmpfs needed): a save that fails removes what it wrote; with the disk full it says
    so (errno ENOSPC, which the engine's message turns into paths.cache_dir), else the error is torch's own."""
    import torch

    from pipeline.engine import checkpoints

    def half_written(obj, f):
        f.write(b"x" * 4096)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 4000")

    monkeypatch.setattr(torch, "save", half_written)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 0, free))
    path = tmp_path / "checkpoints" / "step-00000010.ckpt"
    with pytest.raises(raised) as err:
        checkpoints.AtomicCheckpointIO(keep=2).save_checkpoint({"weights": 1}, path)
    assert list(path.parent.iterdir()) == []
    if raised is OSError:
        assert err.value.errno == errno.ENOSPC and str(path) in str(err.value)


def test_a_stage_to_run_in_a_read_only_cache_says_so_in_one_line(tmp_path, monkeypatch):
    """On a cache mounted read-only (a real `mount -o remount,bind,ro`), a run with a stage
    to run failed with a traceback, `[Errno 30] Read-only file system: …/stages/sink/HASH.lock`: the stage's lock and
    marker were written outside what names a failed stage. Tests run as root: the lock's open raises EROFS here."""
    from pipeline.engine import dag

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    monkeypatch.setattr(dag, "open", read_only, raising=False)
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["source"]})
    the_plan = plan(cfg, FAKE)
    with pytest.raises(StageFailed, match=re.escape(
            f"stage source failed: the cache directory paths.cache_dir={tmp_path / 'cache'} is read-only: it serves "
            "the stages it has finished, but a stage to run writes there; set paths.cache_dir to a writable directory "
            "(a copy of this one keeps its finished stages), then rerun the same command")):
        execute_stage(FAKE, cfg, "source", the_plan.hashes["source"], the_plan.dirs["source"], {}, None)


def test_a_marker_that_cannot_be_written_names_the_stage(tmp_path):
    """A completion marker replaced by a directory made the stage run again (it is not
    complete) and then fail writing its marker with a traceback, IsADirectoryError, from outside what names a failed
    stage."""
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["source"]})
    the_plan = plan(cfg, FAKE)
    (the_plan.dirs["source"] / MARKER).mkdir(parents=True)
    with pytest.raises(StageFailed, match=r"stage source failed: IsADirectoryError: .*_COMPLETE.json"):
        execute_stage(FAKE, cfg, "source", the_plan.hashes["source"], the_plan.dirs["source"], {}, None)


@ray.remote
def _write_in_a_ray_task() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def write_in_the_stage(ctx) -> dict:
    (ctx.out_dir / "out.bin").write_bytes(b"data")
    return {}


def write_in_a_ray_task(ctx) -> dict:
    ray.get(_write_in_a_ray_task.remote())
    return {}


@pytest.mark.parametrize("write", [write_in_the_stage, write_in_a_ray_task])
def test_a_full_disk_in_a_patched_writer_names_the_cache_directory(tmp_path, ray_session, monkeypatch, write):
    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full)
    cfg = _cfg(tmp_path, **{"pipeline.stages": ["write"]})
    stages = {"write": Stage("write", write)}
    the_plan = plan(cfg, stages)
    with pytest.raises(StageFailed, match=re.escape(
            f"stage write failed: no space left on device: the cache directory paths.cache_dir={tmp_path / 'cache'} "
            "is full (")):
        execute_stage(stages, cfg, "write", the_plan.hashes["write"], the_plan.dirs["write"], {}, None)


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


def test_a_stream_a_library_kept_from_a_stage_still_writes_and_closes_after_it(tmp_path, capsys):
    """absl's log handler keeps the sys.stderr it finds when absl is first imported, during a stage: the tee. A later
    Hydra job in the same Ray worker reconfigured logging, which closes every handler's stream, and failed on the
    tee (AttributeError: '_Tee' object has no attribute 'close'); writes after the stage went to its closed log."""
    log = tmp_path / "stage.log"
    with captured_output(log):
        kept = sys.stderr
        print("during the stage", file=sys.stderr)
    handler = logging.StreamHandler(kept)
    handler.emit(logging.makeLogRecord({"msg": "after the stage"}))  # a write and a flush through the kept tee
    kept.close()
    handler.close()
    assert log.read_text() == "during the stage\n"
    assert capsys.readouterr().err == "during the stage\nafter the stage\n"
