"""One-call GPU throughput check: every family's pretraining step on the GPU it finds, against HF and the GPU's
published peak, in at most 8 minutes, written as one JSON and one markdown table (docs/gpu.md says how to run it on a
lent machine and what each column means).

    python benchmarks/gpu_check.py --out DIR              # on a GPU: all phases, 480 s in all
    python benchmarks/gpu_check.py --device cpu --quick   # every phase at tiny sizes on the CPU: checks the script

Phases, in the order they run (each in a process of its own, killed at its own time limit, so that one slow or
crashing part costs only its own row; what was skipped, and why, is printed and kept in the JSON):
  peak              bf16 (and fp32) matmul throughput measured on the device: the reference of "of matmul peak"
  bert              BERT-base pretraining step (MLM + NSP, phase-1 shape: seq 128, the largest batch up to 256 that
                    fits): ours against transformers' BertForPreTraining with SDPA attention, same batch, bf16
  gpt               GPT-small (124M, GPT-2's shape) step at seq 1024: ours against GPT2LMHeadModel with SDPA
  harness           the pipeline's own `bert_pretrain` stage (BERT-base, trainer=gpu) for a fixed number of steps: its
                    steady-state step time against the bare step of the same module and batch (harness overhead)
  decode            GPT-small greedy and beam-4 decoding, ours (models.generation) against HF `generate`
  bert_compile      ours with torch.compile (what trainer.compile=true does)
  gpt_compile       the same for GPT
  harness_deepspeed the bert_pretrain stage under trainer=deepspeed
  elmo              ELMo biLM step at bilm-tf's shape (batch 128 x 20 tokens, 4096-cell LSTMs, sampled softmax)
  skip_thought      Skip-Thought step at the paper's shape (2400-d uni-skip, 20k vocabulary, batch 128 x 30)

The parts: gpu_runner.py (the runner), gpu_phases.py (the phases), gpu_flops.py (FLOP counting, peaks,
MFU), gpu_report.py (the JSON and the table).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from gpu_phases import PHASES
from gpu_runner import BUDGET_S, PHASE_LIMITS, run_all, run_phase_here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--quick", action="store_true", help="every phase at tiny sizes: checks the script")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES))
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for all phases (default {BUDGET_S:.0f}; with --quick on a CPU the sum of the "
                             "phases' limits)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, for a GPU not in the table")
    parser.add_argument("--out", default="gpu_check_out", help="directory of gpu_check.json and gpu_check.md")
    # a phase's own process
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--phase-limit", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.budget is None:
        args.budget = sum(q for _, q in PHASE_LIMITS.values()) if args.quick else BUDGET_S
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.phase:
        run_phase_here(args.phase, args.device, args.quick, args.phase_limit, args.work_dir, args.result)
        return
    if args.device == "cpu" and not args.quick:
        print("on a CPU the full sizes take hours: add --quick (tiny sizes) to check the script", flush=True)
    run_all(args)


if __name__ == "__main__":
    main()
