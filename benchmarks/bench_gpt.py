"""GPT speed: ours (models.gpt, models.generation) against transformers.GPT2LMHeadModel with its faster attention
(attn_implementation="sdpa") at the same config and the same weights, in this run, on this CPU, with its fp32 (and
bf16, where native) matmul throughput measured in the same run.

    python benchmarks/bench_gpt.py            # gpt_small, train batch 4 x 256, 128 generated tokens, 5 repeats
    python benchmarks/bench_gpt.py --quick    # 2 repeats
    python benchmarks/bench_gpt.py --smoke    # gpt_tiny at toy sizes, 1 repeat: checks the script, measures nothing

Both models hold the same weights: ours from the seed, HF's read from the directory models.hf.gpt.to_hf writes of it.
Train step: forward + next-token loss over every position + backward + fused AdamW update + zero_grad. Generation:
greedy decoding of `--new-tokens` tokens after a `--prompt-len`-token prompt at batch 1, ours (models.generation.greedy,
KV cache) against HF's `generate` (do_sample=False, its default dynamic KV cache); in fp32 the two must produce the
same tokens, or the script fails. There is no end-of-text token, so both generate every token asked for. Train steps
in bf16 run under autocast (as the pipeline's bf16-mixed); generation in bf16 stores the weights in bf16.

The machine may be shared: every repeat times each variant once, in turn (interleaved), the tables show medians over
repeats after a warm-up, and the matmul peak is the best of a short measurement in every repeat.

Model FLOPs per train step count multiply-adds x 2 of the matmuls the task needs, with B sequences of T tokens, L
layers, width H, vocabulary V:
    blocks      2 * B*T * L * 12 H^2             (q, k, v and output projections, the 4H feed-forward)
    attention   2 * B * L * 2 * H * T(T+1)/2     (Q K^T and probabilities x V over the causal half only)
    LM head     2 * B*T * H * V                  (tied to the token embeddings)
training = 3 x forward. Work beyond that (a backend computing the masked half of attention) shows up as time, not as a
higher fraction of peak.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch
import transformers
from bench_train import matmul_flops_per_s

from models.generation import greedy
from models.gpt import GPTConfig, GPTLMHeadModel, gpt_config
from models.hf.gpt import to_hf
from models.kernels import use_fast_kernels
from pipeline.engine.training import cpu_computes_bf16, keep_freed_memory_for_reuse


def config(args):
    return gpt_config(args.size, vocab_size=args.vocab_size, n_positions=args.n_positions, eos_token_id=None)


def ours_and_hf(args) -> tuple[GPTLMHeadModel, transformers.GPT2LMHeadModel]:
    """Ours from the seed and HF's sdpa model with the same weights."""
    torch.manual_seed(0)
    ours = use_fast_kernels(GPTLMHeadModel(config(args)))  # as the pipeline runs it (trainer.fast_kernels)
    with tempfile.TemporaryDirectory() as hf_dir:
        to_hf(ours, hf_dir)
        hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="sdpa")
    return ours, hf


def train_flops(c, B: int, T: int) -> int:
    L, H, V = c.n_layer, c.n_embd, c.vocab_size
    return 3 * (2 * B * T * L * 12 * H * H + 2 * B * L * 2 * H * T * (T + 1) // 2 + 2 * B * T * H * V)


def interleaved(fns: dict, warmup: int, repeats: int, peak_dtype: torch.dtype | None = None,
                peak_seconds: float = 0.0) -> tuple[dict[str, float], float]:
    """Median seconds of each of `fns` over `repeats` rounds, each round timing every one once, after `warmup`
    rounds; and, given `peak_dtype`, the best matmul throughput of that dtype measured between rounds."""
    times, peak = {name: [] for name in fns}, 0.0
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
        if peak_dtype is not None:
            peak = max(peak, matmul_flops_per_s(peak_dtype, peak_seconds))
    return {name: statistics.median(t) for name, t in times.items()}, peak


def train_benchmark(args, dtype: str) -> list[str]:
    c = config(args)
    B, T = args.batch_size, args.seq_len
    g = torch.Generator().manual_seed(0)
    block = torch.randint(0, c.vocab_size, (B, T + 1), generator=g)
    batch = {"input_ids": block[:, :-1].contiguous(), "targets": block[:, 1:].contiguous()}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()

    def step_of(model, loss_fn):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)  # as the pipeline's

        def step():
            with autocast:
                loss = loss_fn(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    ours, hf = ours_and_hf(args)
    steps = {"ours": step_of(ours, lambda b: ours(b["input_ids"], b["targets"]).loss),
             # shift_labels: HF scores the same next tokens as ours (from `labels` alone it scores T - 1 of T positions)
             "HF sdpa": step_of(hf, lambda b: hf(input_ids=b["input_ids"], labels=b["targets"],
                                                  shift_labels=b["targets"]).loss)}
    seconds, peak = interleaved(steps, args.warmup, args.repeats, torch.bfloat16 if dtype == "bf16" else torch.float32,
                                args.peak_seconds)
    flops = train_flops(c, B, T)
    lines = [f"train step, {args.size} {dtype}, batch {B} x {T}: matmul peak {peak / 1e9:.0f} GFLOP/s",
             f"{'model':10s} {'s/step':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'of peak':>8s}"]
    for name, s in seconds.items():
        lines.append(f"{name:10s} {s:8.3f} {B * T / s:9.0f} {flops / s / 1e9:8.1f} {flops / s / peak:8.1%}")
    lines.append(f"ratio train {dtype}: ours / HF sdpa = {seconds['HF sdpa'] / seconds['ours']:.2f}x tokens/s, ours at "
                 f"{flops / seconds['ours'] / peak:.1%} of the {dtype} matmul peak")
    return lines


def generation_benchmark(args, dtype: str) -> list[str]:
    ours, hf = (m.eval() for m in ours_and_hf(args))
    if dtype == "bf16":  # weights stored in bf16: decoding reads every weight per token, half the bytes
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
    prompt = torch.randint(0, ours.config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(1))
    out = {}

    def run_ours():
        out["ours"] = greedy(ours, prompt.tolist(), args.new_tokens)[0]

    def run_hf():
        ids = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                          do_sample=False, num_beams=1, pad_token_id=0)
        out["HF"] = ids[0, args.prompt_len:].tolist()

    seconds, _ = interleaved({"ours": run_ours, "HF generate": run_hf}, args.warmup, args.repeats)
    same = out["ours"] == out["HF"]
    if dtype == "fp32" and not same:  # the same weights and greedy: a difference is a bug in one of the two
        first = next(i for i, (a, b) in enumerate(zip(out["ours"], out["HF"])) if a != b)
        raise SystemExit(f"greedy generation in fp32: ours and HF generate differ from new token {first} on "
                         f"({out['ours'][first]} vs {out['HF'][first]}); the timings compare different work")
    n = args.new_tokens
    lines = [f"greedy generation, {args.size} {dtype}, batch 1, prompt {args.prompt_len} tokens, {n} new tokens "
             f"({'the same tokens' if same else 'different tokens (bf16 rounding)'} from both)",
             f"{'model':12s} {'s':>8s} {'tokens/s':>9s} {'ms/token':>9s}"]
    for name, s in seconds.items():
        lines.append(f"{name:12s} {s:8.3f} {n / s:9.1f} {1000 * s / n:9.2f}")
    lines.append(f"ratio generate {dtype}: ours / HF generate = {seconds['HF generate'] / seconds['ours']:.2f}x "
                 "tokens/s")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    parser.add_argument("--smoke", action="store_true", help="gpt_tiny at toy sizes, 1 repeat: checks the script runs")
    parser.add_argument("--size", default="gpt_small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"],
                        help="default: fp32, and bf16 where the CPU has native bf16 (AMX / AVX512-BF16)")
    args = parser.parse_args(argv)
    args.vocab_size, args.n_positions = GPTConfig.vocab_size, GPTConfig.n_positions  # GPT-2's
    args.warmup, args.peak_seconds = 1, 1.0
    if args.quick:
        args.repeats = 2
    if args.smoke:
        args.size, args.vocab_size, args.n_positions = "gpt_tiny", 512, 64
        args.batch_size, args.seq_len, args.prompt_len, args.new_tokens = 2, 16, 4, 8
        args.repeats, args.peak_seconds = 1, 0.05
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    transformers.logging.set_verbosity_error()  # its notes on loading and generation settings
    transformers.utils.logging.disable_progress_bar()
    dtypes = args.dtypes or ["fp32", *(["bf16"] if cpu_computes_bf16() else [])]
    if "bf16" not in dtypes and not cpu_computes_bf16():
        print("this CPU has no native bf16 (AMX / AVX512-BF16): bf16 rows skipped")
    for benchmark in (train_benchmark, generation_benchmark):
        for dtype in dtypes:
            print("", *benchmark(args, dtype), sep="\n", flush=True)
    print(f"\n{torch.get_num_threads()} threads, median of {args.repeats} repeats after {args.warmup} warm-up; load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("targets: train >= 1.3x HF sdpa and >= 75% of the fp32 matmul peak; generation >= 1.3x HF "
          "generate")


if __name__ == "__main__":
    main()
