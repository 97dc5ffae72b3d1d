"""The data benchmarks at scale (issue 19): bench_data.py --scale's options and rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_data  # noqa: E402

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


def test_the_shared_tokenizer_reads_the_first_books_only(monkeypatch, tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n" * 50)
    (tmp_path / "b.txt").write_text("beta\n" * 50)
    seen = []
    monkeypatch.setattr(bench_data, "TOKENIZER_SAMPLE_BYTES", 100)
    monkeypatch.setattr("data_prep.tokenizer.train_wordpiece", lambda lines, out, vocab_size: seen.extend(lines))
    bench_data.train_tokenizer(tmp_path, tmp_path / "tok")
    assert seen and set(seen) == {"alpha"}
