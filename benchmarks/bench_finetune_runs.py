"""The fine-tune stage's wall time for K runs of `bert` (or --model) of make run's bert_tiny, from its cached
pretraining, trained by the stage itself (pipeline/downstream/finetune.py) with finetune.parallel_runs=2, two Ray
workers of one thread each, against parallel_runs=1, one run after another on every thread, in the same run, on the
same runs (seeds 1..K at one train size): the ratio of the two, and whether every run scored the same both ways.

Reads the upstream stages of `make run`'s finetune stage from the cache (paths.cache_dir); run `make run` first.

    python benchmarks/bench_finetune_runs.py            # 4 runs on all examples (make bench-finetune-runs)
    python benchmarks/bench_finetune_runs.py --runs 2 --train-size 32 finetune.min_steps=5    # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import pipeline.config  # noqa: F401  registers the config schema that conf/config.yaml composes with
from pipeline import CONF_DIR
from pipeline.downstream import finetune as finetuning
from pipeline.engine.dag import StageContext, is_complete, plain_config, plan
from pipeline.runner import start_local_ray
from pipeline.stages import STAGES


def stage_seconds(cfg, inputs: dict[str, Path], out_dir: Path, parallel_runs: int, threads: int) -> tuple[float, dict]:
    """Seconds the fine-tune stage took, and each run's scores (tag -> {metric: score})."""
    cfg = plain_config(cfg)
    cfg.finetune.parallel_runs = parallel_runs
    out_dir.mkdir()
    torch.set_num_threads(threads)  # the stage's own threads, as the engine sizes them: every CPU it was granted
    started = time.perf_counter()
    finetuning.finetune(StageContext(cfg, "finetune", out_dir, inputs))
    seconds = time.perf_counter() - started
    scores = {path.stem: {row["metric"]: row["score"] for row in json.loads(path.read_text())}
              for path in sorted((out_dir / "finished").glob("*.json"))}
    return seconds, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="fine-tuning runs (seeds 1..runs) each way")
    parser.add_argument("--train-size", default="all",
                        help="labelled examples per run, or all: ~8,500 of Rotten Tomatoes, 800 steps a run, so that "
                             "the workers' start (a few seconds each) weighs as little as in make run's 27 runs")
    parser.add_argument("--threads", type=int, default=2, help="the stage's CPUs (ray.num_cpus)")
    parser.add_argument("--model", default="bert", help="the model kind fine-tuned (finetune.models)")
    parser.add_argument("overrides", nargs="*", help="more config overrides, e.g. finetune.min_steps=5")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "+experiment=bert_tiny", f"paths.run_dir={tmp}", "logger=csv", f"ray.num_cpus={args.threads}",
            f"finetune.models=[{args.model}]", "finetune.random_twins=false", "finetune.controls=false",
            "finetune.baselines=[]",
            f"finetune.train_sizes=[{'null' if args.train_size == 'all' else int(args.train_size)}]",
            f"finetune.seeds=[{','.join(str(seed) for seed in range(1, args.runs + 1))}]",
            *args.overrides])
        the_plan = plan(cfg, STAGES)
        upstream = the_plan.stages["finetune"].upstream
        missing = [name for name in upstream if not is_complete(the_plan.dirs[name])]
        if missing:
            raise SystemExit(f"the cache ({cfg.paths.cache_dir}) has no finished {', '.join(missing)} of make run's "
                             "config: run `make run` first")
        inputs = {name: the_plan.dirs[name] for name in upstream}
        start_local_ray(args.threads, log_to_driver=False)
        print(f"{args.runs} runs of {args.model} on {args.train_size} examples, {args.threads} CPUs, "
              f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'default')}", flush=True)
        seconds, scores = {}, {}
        for parallel in (1, 2):
            seconds[parallel], scores[parallel] = stage_seconds(cfg, inputs, Path(tmp) / f"parallel_runs_{parallel}",
                                                                parallel, args.threads)
            print(f"  parallel_runs={parallel}: {seconds[parallel]:.1f} s", flush=True)
    differing = [f"{tag} {scores[1][tag]} vs {scores[2].get(tag)}" for tag in scores[1]
                 if scores[1][tag] != scores[2].get(tag)]
    print(f"\n{'parallel_runs':<14} {'threads/run':>11} {'seconds':>8} {'runs/min':>9}   "
          f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    for parallel, s in seconds.items():
        print(f"{parallel:<14} {max(1, args.threads // parallel):>11} {s:8.1f} {args.runs / s * 60:9.2f}")
    print(f"ratio: parallel_runs=2 / parallel_runs=1 = {seconds[1] / seconds[2]:.2f}x runs/s; scores "
          + (f"differ: {'; '.join(differing)}" if differing else "identical run by run"))


if __name__ == "__main__":
    main()
