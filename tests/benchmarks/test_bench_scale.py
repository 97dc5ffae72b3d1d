"""The data benchmarks at scale (issue 19): bench_data.py --scale's options and rows, bench_stages.py's sampling of
a process tree and attribution of its samples to the stages that were running."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_data  # noqa: E402
import bench_stages  # noqa: E402
from bench_stages import Run, Sample  # noqa: E402

# --------------------------------------------------------------------------- bench_data.py --scale

def test_scale_options_read_as_a_user_writes_them(capsys):
    args = bench_data.parse_args(["--scale", "2GB", "--seed", "3"])
    assert args.scale_bytes == 2 << 30 and args.scale_dir.name == f"textrep-scale-{2 << 30}B-seed3"
    assert bench_data.parse_args(["--scale", "50mb", "--scale-dir", "/tmp/x"]).scale_dir == Path("/tmp/x")
    assert bench_data.parse_args([]).scale_bytes is None
    for argv, message in ((["--scale", "lots"], "write a size such as 1GB"), (["--scale", "0"], "must be positive"),
                          (["--scale-dir", "/tmp/x"], "--scale-dir needs --scale SIZE")):
        with pytest.raises(SystemExit):
            bench_data.parse_args(argv)
        assert message in capsys.readouterr().err


def test_scale_rows_give_both_worker_counts_with_and_after_ray_start_up_against_the_targets():
    hf = {"seconds": 100.0, "peak_rss": 2e9}
    ours2 = {"seconds": 40.0, "ray_start_seconds": 5.0, "prepare_seconds": 20.0, "peak_rss": 1e9}
    ours1 = {"seconds": 70.0, "ray_start_seconds": 5.0, "prepare_seconds": 40.0, "peak_rss": 1e9}
    rows = {row[0]: row[1:] for row in bench_data.scale_rows(1000.0, hf, ours2, ours1)}
    assert rows["raw -> token ids, HF datasets (num_proc=2)"][0] == "10.00 MB/s"
    assert rows["raw -> token ids, ours (2 Ray workers), Ray start-up included"][:2] == (
        "25.00 MB/s", "2.50x HF (target >= 2.5x)")
    assert rows["raw -> token ids, ours (2 Ray workers), after Ray start-up"][:2] == (
        "28.57 MB/s", "2.86x HF (target >= 2.5x)")
    assert rows["raw -> token ids, ours (1 Ray worker), after Ray start-up"][:2] == ("15.38 MB/s", "1.54x HF")
    assert rows["1 -> 2 workers, Ray start-up included"][:2] == ("1.75x", "target >= 1.8x")
    assert rows["1 -> 2 workers, after Ray start-up"][:2] == ("1.86x", "target >= 1.8x")


def test_speed_runs_interleave_take_medians_and_remove_each_runs_outputs(monkeypatch, tmp_path):
    order = []

    def measure(args):
        kind, workdir = args[0] + (args[4] if args[0] == "ours" else ""), Path(args[2])
        workdir.mkdir()
        (workdir / "ids.arrow").write_bytes(b"x")
        order.append(kind)
        return {"seconds": float(len(order))}

    monkeypatch.setattr(bench_data, "measure", measure)
    hf, ours2, ours1 = bench_data.speed_runs(tmp_path, tmp_path, "tok.json", repeat=3)
    assert order == ["hf", "ours2", "ours1"] * 3
    assert (hf["seconds"], ours2["seconds"], ours1["seconds"]) == (4.0, 5.0, 6.0)
    assert list(tmp_path.iterdir()) == []


def test_the_peak_counts_a_grandchild_started_later_and_the_tree_is_looked_up_about_once_a_second(monkeypatch):
    # The lookup scans all of /proc; done at every sample it took CPU from the measured run (bench_data.py's constants)
    lookups, reads = [], []
    children, memory_info = psutil.Process.children, psutil.Process.memory_info
    monkeypatch.setattr(psutil.Process, "children", lambda self, **kw: lookups.append(1) or children(self, **kw))
    monkeypatch.setattr(psutil.Process, "memory_info", lambda self: reads.append(1) or memory_info(self))
    grandchild = "b = bytearray(b'x' * (200 << 20)); import time; time.sleep(1.5)"
    script = (f"import subprocess, sys, time; time.sleep(0.5); subprocess.run([sys.executable, '-c', {grandchild!r}]); "
              "print('done')")
    started = time.monotonic()
    returncode, out, peak = bench_data.run_with_peak_rss([sys.executable, "-c", script])
    seconds = time.monotonic() - started
    assert (returncode, out.decode().strip()) == (0, "done")
    assert peak > 200 << 20
    # ~2.5 s: a lookup a second (one every sample would be ~50), an RSS read of each process found every 100 ms
    assert 2 <= len(lookups) <= seconds + 2 and len(reads) >= 3 * len(lookups)


def test_the_shared_tokenizer_reads_the_first_books_only(monkeypatch, tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n" * 50)
    (tmp_path / "b.txt").write_text("beta\n" * 50)
    seen = []
    monkeypatch.setattr(bench_data, "TOKENIZER_SAMPLE_BYTES", 100)
    monkeypatch.setattr("data_prep.corpus.tokenizer.train_wordpiece", lambda lines, out, vocab_size: seen.extend(lines))
    bench_data.train_tokenizer(tmp_path, tmp_path / "tok")
    assert seen and set(seen) == {"alpha"}


# --------------------------------------------------------------------------- bench_stages.py

def test_stage_lines_are_read_through_rays_prefix():
    parse = bench_stages.parse_stage_line
    assert parse("(stage:prepare pid=4242) stage prepare: running (e91f4ee41ee66703) → /c/stages/prepare/e9") == (
        "prepare", "running")
    assert parse("(stage:elmo_vocab pid=7, ip=10.0.0.2) stage elmo_vocab: done in 12.5 s") == ("elmo_vocab", "done")
    assert parse("stage bert_tokenizer: cached (d8376f90313bac67)") == ("bert_tokenizer", "cached")
    assert parse("(stage:prepare pid=4242) prepare: 108 books, 3 shards") is None


def test_each_sample_goes_to_every_stage_running_when_it_was_taken():
    events = [(1.0, "prepare", "running"), (5.0, "prepare", "done"),
              (5.5, "bert_tokenizer", "running"), (9.0, "bert_tokenizer", "done"),
              (6.0, "elmo_vocab", "running"), (8.0, "elmo_vocab", "done")]
    intervals = bench_stages.stage_intervals(events, {}, end=10.0)
    samples = [Sample(t, rss=int(t * 100), shmem=10, store=1000 if t == 7.0 else 0, processes=int(t))
               for t in (0.5, 2.0, 4.0, 5.2, 6.5, 7.0, 8.5, 9.5)]
    peaks = bench_stages.stage_peaks(samples, intervals)
    assert peaks["prepare"]["peak_rss"] == 400 and peaks["prepare"]["samples"] == 2
    assert peaks["prepare"]["alongside"] == []
    assert peaks["elmo_vocab"]["peak_rss"] == 700 and peaks["elmo_vocab"]["peak_store"] == 1000
    assert peaks["elmo_vocab"]["peak_total"] == 700 - 10 + 1000  # the store counted once, not through the RSS
    assert peaks["bert_tokenizer"]["peak_rss"] == 850 and peaks["bert_tokenizer"]["alongside"] == ["elmo_vocab"]
    assert peaks["bert_tokenizer"]["peak_processes"] == 8


def test_a_stage_line_ray_dropped_is_placed_by_the_stage_duration():
    events = [(2.0, "prepare", "running"), (10.0, "bert_tokenizer", "done"), (11.0, "bert_examples", "running")]
    intervals = bench_stages.stage_intervals(events, {"prepare": 3.0, "bert_tokenizer": 4.0}, end=20.0)
    assert intervals == {"prepare": (2.0, 5.0), "bert_tokenizer": (6.0, 10.0), "bert_examples": (11.0, 20.0)}


def test_a_serial_report_takes_each_stage_from_the_run_where_it_ran():
    def run(started, ended, stages, samples):
        return Run(samples=samples, events=[(started + 1, name, "running") for name, (state, _) in stages.items()
                                            if state == "ran"], started=started, ended=ended,
                   stages={name: {"state": state, "duration_s": d} for name, (state, d) in stages.items()})

    runs = [run(0.0, 10.0, {"prepare": ("ran", 5.0)}, [Sample(3.0, 2 * 10**9, 0, 0, 9, (("driver", 10**9),))]),
            run(10.0, 30.0, {"prepare": ("cached", 5.0), "bert_tokenizer": ("ran", 10.0)},
                [Sample(15.0, 10**9, 0, 5, 7)])]
    result = bench_stages.report(runs, ["prepare", "bert_tokenizer", "bert_examples"], corpus_bytes=100 * 10**6,
                                 workers=2)
    prepare, tokenizer, examples = (result["stages"][s] for s in ("prepare", "bert_tokenizer", "bert_examples"))
    assert prepare["state"] == "ran" and prepare["seconds"] == 5.0 and prepare["mb_per_s_per_worker"] == 10.0
    assert prepare["peak_rss"] == 2 * 10**9 and tokenizer["peak_rss"] == 10**9 and tokenizer["peak_store"] == 5
    assert examples["state"] == "not run"
    assert result["run"]["seconds"] == 30.0 and result["run"]["peak_rss"] == 2 * 10**9
    assert result["run"]["peak_processes"] == 9 and result["run"]["rss_by_role_at_peak"] == {"driver": 10**9}
    table = bench_stages.format_table(result)
    assert "bert_examples" in table and "not run" in table and "whole run" in table


def test_the_data_stages_are_the_pipelines_and_prepare_comes_first(tmp_path):
    from pipeline.stages import STAGES

    assert all(stage in STAGES for stages in bench_stages.DATA_STAGES.values() for stage in stages)
    args = bench_stages.parse_args(["--corpus", str(tmp_path), "--families", "elmo", "bert", "--", "seed=1"])
    assert args.stages == ["prepare", "elmo_vocab", "elmo_streams", "bert_tokenizer", "bert_examples"]
    assert args.overrides == ["seed=1"]


def test_the_tree_sample_counts_grandchildren_and_no_object_store_without_ray():
    grandchild = "b = bytearray(b'x' * (200 << 20)); print(flush=True); import time; time.sleep(60)"
    child = psutil.Popen([sys.executable, "-c", "import subprocess, sys; "
                          f"subprocess.run([sys.executable, '-c', {grandchild!r}])"], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the grandchild holds its 200 MB
        sample = bench_stages.sample_tree(child, 0.0)
        assert sample.rss > 200 << 20 > child.memory_info().rss and sample.processes == 2
        roles = dict(sample.roles)  # the root is the driver; the grandchild a python without a script
        assert set(roles) == {"driver", child.children()[0].name()} and sum(roles.values()) == sample.rss
        assert roles["driver"] < 200 << 20 < roles[child.children()[0].name()]
        assert bench_stages.ObjectStore().used(bench_stages.tree_of(child)) == 0
    finally:
        for process in [*child.children(recursive=True), child]:
            process.kill()


@pytest.mark.slow
def test_the_object_store_is_what_the_raylet_in_the_tree_reports():
    script = ("import ray, time; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False); "
              "ref = ray.put(b'x' * (64 << 20)); print(flush=True); time.sleep(120)")
    child = psutil.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the object is in the store
        store = bench_stages.ObjectStore().used(bench_stages.tree_of(child))
        assert 64 << 20 <= store < 65 << 20
        sample = bench_stages.sample_tree(child, 0.0, store)
        # the driver wrote it: its pages are in the driver's RSS as shared memory, which the total leaves out
        assert sample.shmem >= 64 << 20 and sample.total < sample.rss + (1 << 20)
    finally:
        child.terminate()  # the driver's ray.shutdown stops the Ray processes it started
        child.wait(60)
