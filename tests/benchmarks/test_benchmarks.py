"""The benchmark scripts run: each in its smoke mode (toy sizes, one repeat), printing the ratio lines `make bench-*`
reports. Their numbers at these sizes mean nothing."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pipeline import CONF_DIR

REPO = CONF_DIR.parent


def test_bench_gpt_smoke_prints_the_train_and_generation_ratios():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpt.py"), "--smoke", "--dtypes", "fp32"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(r"^ratio train fp32: ours / HF sdpa = \d+\.\d\dx tokens/s, ours at \d+\.\d% of the fp32 matmul "
                     r"peak$", out, re.M), out
    assert re.search(r"^ratio generate fp32: ours / HF generate = \d+\.\d\dx tokens/s$", out, re.M), out
    assert "(the same tokens from both)" in out  # the same weights in both, as models.hf.gpt.to_hf writes them


def test_bench_seq2seq_smoke_prints_the_train_and_generation_ratios():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_seq2seq.py"), "--smoke"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(r"^ratio train fp32: ours / HF sdpa = \d+\.\d\dx tokens/s, ours at \d+\.\d% of the fp32 matmul "
                     r"peak$", out, re.M), out
    assert re.search(r"^ratio generate fp32: ours / HF generate = \d+\.\d\dx tokens/s$", out, re.M), out
    assert "(the same tokens from both)" in out  # the same weights and the same search: models.hf.seq2seq.to_hf's


def test_bench_gpt_refuses_to_time_fp32_generations_that_differ(monkeypatch):
    """The same weights decoded greedily in fp32 give the same tokens; where they do not, one side has a bug and the
    timings would compare different work."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_gpt

    real_greedy = bench_gpt.greedy
    monkeypatch.setattr(bench_gpt, "greedy", lambda model, prompts, n: [[*real_greedy(model, prompts, n)[0][:-1], -1]])
    with pytest.raises(SystemExit, match=r"ours and HF generate differ from new token 7 on \(-1 vs \d+\)"):
        bench_gpt.generation_benchmark(bench_gpt.parse_args(["--smoke"]), "fp32")


def test_bench_seq2seq_refuses_to_time_beam_searches_that_differ(monkeypatch):
    """The same weights searched with the same beams give the same tokens; where they do not, one side has a bug and
    the timings would compare different work."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_seq2seq

    real_beam_search = bench_seq2seq.beam_search

    def last_token_changed(*args, **kwargs):
        hypotheses = real_beam_search(*args, **kwargs)
        hypotheses[0].tokens[-1] = -1
        return hypotheses

    monkeypatch.setattr(bench_seq2seq, "beam_search", last_token_changed)
    with pytest.raises(SystemExit, match=r"ours and HF generate differ from new token 5 on"):
        bench_seq2seq.generation_benchmark(bench_seq2seq.parse_args(["--smoke"]))


def test_bench_finetune_prints_each_rows_steps_and_its_ratio_to_the_pipelines_fine_tuning():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_finetune.py"), "--steps", "36",
                          "--threads", "1", "--precision", "32-true", "--rows", "pipeline", "plain loop",
                          "2 x 1 thread"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(r"^bert_tiny classifier, 36 batches of 32 sentences .* 32-true, 1 threads, .* GFLOP a step; "
                     r"matmul peak \d+ GFLOP/s", out, re.M), out
    assert re.search(r"^pipeline +\d+\.\d +\d+ +\d+% +1\.00x$", out, re.M), out
    for row in ("plain loop", "2 x 1 thread"):
        assert re.search(rf"^{row} +\d+\.\d +\d+ +\d+% +\d+\.\d\dx$", out, re.M), out


def test_bench_finetunes_batches_are_grouped_by_length_around_rotten_tomatoes_mean():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_finetune

    batches = bench_finetune.sentence_batches(60)
    assert len(batches) == 60 and all(b["input_ids"].shape[0] == 32 for b in batches)
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    assert 28 <= sum(lengths) / len(lengths) <= 34 and max(lengths) <= bench_finetune.MAX_LENGTH
    padded = sum(b["input_ids"].numel() for b in batches)
    assert sum(lengths) / padded > 0.9  # grouped: a batch pads to its longest sentence and little more
