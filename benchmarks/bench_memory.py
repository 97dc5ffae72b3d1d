"""Does pretraining's resident memory stay flat? Every family's own pretrain stage, run by the pipeline for a few
hundred steps at batch 32 and 128, with the `memory_log` callback (pipeline.engine.training.MemoryLog) recording the
stage process's RSS every 10 steps; the growth per step is the least-squares slope after warm-up.

    python benchmarks/bench_memory.py                       # every family, batch 32 and 128, 300 steps, fp32
    python benchmarks/bench_memory.py --families bert --batch-sizes 128 --steps 600
    python benchmarks/bench_memory.py --precision auto      # bf16 autocast where this CPU has it

Target: <= 0.1 MB per step after warm-up. fp32 is the default because that is where batches of
changing shapes grew the heap (~4.5 MB per step for bert_tiny at batch 32, docs/reliability.md); under bf16 autocast
BERT rounds its shapes. The data stages run once on the built-in corpus, in a cache of the benchmark's own
(`--cache-dir`), and are reused by every row.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.engine.training import RELEASE_EVERY_N_BATCHES

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB_PER_STEP = 0.1


@dataclass(frozen=True)
class FamilyRun:
    experiment: str
    stage: str
    batch_key: str  # the setting that holds the family's batch size


FAMILIES = {
    "bert": FamilyRun("bert_tiny", "bert_pretrain", "pretrain.batch_size"),
    "gpt": FamilyRun("gpt_tiny", "gpt_pretrain", "pretrain.batch_size"),
    "elmo": FamilyRun("elmo_small", "elmo_pretrain", "elmo.batch_size"),
    "skip_thought": FamilyRun("skip_thought_small", "skip_thought_pretrain", "pretrain.batch_size"),
}


def retained_growth_per_step(rows: list[tuple[int, float]], warmup: int,
                             release_every: int = RELEASE_EVERY_N_BATCHES) -> float:
    """MB per step that stays: the least-squares slope of RSS right after each release of freed memory (every
    `release_every` steps, pipeline.engine.training.ReleaseFreedMemory) after `warmup` steps. Between releases RSS
    climbs as the allocator keeps freed blocks (a sawtooth whose peak the table shows); a slope over every sample
    measures where in that sawtooth the run stopped, not growth."""
    after = [(step, rss) for step, rss in rows if step > warmup and step % release_every == 0]
    if len(after) < 3:
        raise ValueError(f"{len(after)} memory samples after releases past step {warmup}; run more --steps")
    steps, rss = np.array(after, dtype=float).T
    return float(np.polyfit(steps, rss, 1)[0])


def run_family(family: str, batch_size: int, steps: int, precision: str, cache_dir: Path, runs_dir: Path) -> Path:
    """Runs the family's pipeline up to its pretraining stage; returns the stage's memory.csv."""
    run = FAMILIES[family]
    run_dir = runs_dir / f"{family}-b{batch_size}-{precision}"
    cmd = [sys.executable, "-m", "pipeline", f"+experiment={run.experiment}", f"pipeline.until={run.stage}",
           f"pretrain.max_steps={steps}", f"{run.batch_key}={batch_size}", f"trainer.precision={precision}",
           "callbacks=memory_log", "logger=csv", f"pretrain.val_every_steps={steps}",
           f"pretrain.checkpoint_every_steps={steps}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "TEXTREP_CACHE_DIR": str(cache_dir)}
    log = runs_dir / f"{run_dir.name}.log"
    with open(log, "w") as out:
        result = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}); its output: {log}")
    return (run_dir / run.stage).resolve() / "memory.csv"


def read_memory(path: Path) -> list[tuple[int, float]]:
    with open(path) as f:
        return [(int(r["step"]), float(r["rss_mb"])) for r in csv.DictReader(f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the slope (default: a third)")
    parser.add_argument("--precision", default="32-true", help="trainer.precision of every run (auto, 32-true, ...)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "textrep-bench-memory")
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else args.steps // 3
    runs_dir = args.cache_dir / "runs" / time.strftime("%Y-%m-%d_%H-%M-%S")
    runs_dir.mkdir(parents=True)
    print(f"| family | batch | steps | precision | RSS after the first release past step {warmup} (MB) | RSS at end "
          f"(MB) | peak RSS (MB) | retained growth (MB/step) | target <= {TARGET_MB_PER_STEP} |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for family in args.families:
        for batch_size in args.batch_sizes:
            started = time.perf_counter()
            rows = read_memory(run_family(family, batch_size, args.steps, args.precision, args.cache_dir, runs_dir))
            slope = retained_growth_per_step(rows, warmup)
            at_warmup = next(rss for step, rss in rows if step > warmup and step % RELEASE_EVERY_N_BATCHES == 0)
            peak = max(rss for step, rss in rows if step > warmup)
            met = slope <= TARGET_MB_PER_STEP
            failed |= not met
            verdict = f"{'met' if met else 'NOT met'} ({time.perf_counter() - started:.0f} s)"
            print(f"| {family} | {batch_size} | {args.steps} | {args.precision} | {at_warmup:.0f} | {rows[-1][1]:.0f} "
                  f"| {peak:.0f} | {slope:+.3f} | {verdict} |", flush=True)
    print(f"logs and memory.csv files: {runs_dir}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
