"""The GPU check's runner: each phase in a process of its own, killed at its own time limit, within the whole
check's budget; then the report."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from gpu_phases import FULL, PHASES, QUICK, PhaseContext, SkipPhase
from gpu_report import write_report

BUDGET_S = 480.0  # the whole check on a GPU: the 8 minutes
# Phase -> (time limit on a GPU, time limit with --quick on a CPU), seconds; in running order (most wanted first)
PHASE_LIMITS: dict[str, tuple[float, float]] = {
    "peak": (20, 60), "bert": (70, 180), "gpt": (70, 180), "harness": (90, 240), "decode": (45, 180),
    "bert_compile": (90, 300), "gpt_compile": (90, 300), "harness_deepspeed": (80, 240), "elmo": (40, 120),
    "skip_thought": (40, 120)}
MIN_SHARE = 0.5  # a phase starts only if at least this share of its limit is left in the budget

assert list(PHASES) == list(PHASE_LIMITS)


def run_phase_here(name: str, device: str, quick: bool, limit: float, work_dir: Path, result: Path) -> None:
    """The body of a phase's process: runs the phase and writes {"device", "rows"} or {"skipped"} to `result`."""
    from pipeline.engine.training import keep_freed_memory_for_reuse

    started = time.perf_counter()
    keep_freed_memory_for_reuse()
    dev = torch.device(device)
    # Wrap up with a tenth of the limit (at least 5 s) to spare: the parent kills the process at the limit itself
    ctx = PhaseContext(dev, QUICK if quick else FULL, quick, started + limit - max(5.0, 0.1 * limit), work_dir)
    name_of_device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({torch.get_num_threads()} " \
                                                                                 "threads)"
    try:
        out = {"device": name_of_device, "rows": PHASES[name](ctx)}
    except SkipPhase as reason:
        out = {"device": name_of_device, "skipped": str(reason)}
    except Exception as error:  # reported as the phase's reason for having no rows; the other phases go on
        traceback.print_exc()
        out = {"device": name_of_device, "skipped": f"failed: {type(error).__name__}: {str(error)[:300]}"}
    for r in out.get("rows", []):
        r["phase"] = name
    out["seconds"] = time.perf_counter() - started
    result.write_text(json.dumps(out))


def run_phase(name: str, args, limit: float, work_dir: Path) -> dict:
    """Runs phase `name` in a process of its own, killed (its whole process group) after `limit` seconds."""
    result = work_dir / f"{name}.json"
    command = [sys.executable, str(Path(__file__).resolve().with_name("gpu_check.py")), "--phase", name,
               "--device", args.device, "--phase-limit", str(limit), "--work-dir", str(work_dir),
               "--result", str(result), *(["--quick"] if args.quick else [])]
    started = time.perf_counter()
    process = subprocess.Popen(command, start_new_session=True)
    try:
        process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return {"skipped": f"ran past its {limit:.0f} s limit and was stopped",
                "seconds": time.perf_counter() - started}
    if not result.exists():
        return {"skipped": f"its process ended with exit code {process.returncode} and no result",
                "seconds": time.perf_counter() - started}
    return json.loads(result.read_text())


def run_all(args) -> dict:
    budget_end = time.perf_counter() + args.budget
    work_dir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    phases, skipped, device = {}, {}, None
    for name in args.phases:
        limit = PHASE_LIMITS[name][1 if args.quick else 0]
        left = max(0.0, budget_end - time.perf_counter())
        if left < MIN_SHARE * limit:
            skipped[name] = (f"not started: {left:.0f} s of the {args.budget:.0f} s budget left, its limit is "
                             f"{limit:.0f} s")
            print(f"[{name}] skipped: {skipped[name]}", flush=True)
            continue
        limit = min(limit, left)
        print(f"[{name}] running (limit {limit:.0f} s)", flush=True)
        out = run_phase(name, args, limit, work_dir)
        device = device or out.get("device")
        if "skipped" in out:
            skipped[name] = out["skipped"]
            print(f"[{name}] skipped: {skipped[name]}", flush=True)
        else:
            phases[name] = out["rows"]
            print(f"[{name}] done in {out['seconds']:.0f} s", flush=True)
    rows = [r for name in phases for r in phases[name]]
    return write_report(rows, skipped, device or "unknown", args)
