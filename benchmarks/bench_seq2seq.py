"""Transformer encoder-decoder speed: ours (models.seq2seq, models.generation) against transformers'
BartForConditionalGeneration (attn_implementation="sdpa") at the same config and the same weights, in this run, on this
CPU, with its fp32 matmul throughput measured in the same run.

    python benchmarks/bench_seq2seq.py          # seq2seq_small as BART, batch 8 x (256 -> 128), beam 4, 5 repeats
    python benchmarks/bench_seq2seq.py --quick  # 2 repeats
    python benchmarks/bench_seq2seq.py --smoke  # seq2seq_tiny at toy sizes, 1 repeat: checks the script only

Both models hold the same weights: ours from the seed in BART's options (models.seq2seq.bart_config: post-LN, learned
positions, GELU; HF's BART computes nothing else), HF's read from the directory models.hf.seq2seq.to_hf writes of it.
Train step: forward + cross-entropy over every target position + backward + fused AdamW update + zero_grad, with
BART's dropout (0.1) in both. Generation: beam search with 4 beams over one `--source-len`-token source for
`--new-tokens` tokens, ours (models.generation.beam_search, alpha = 0) against HF's `generate` (num_beams=4,
length_penalty=0.0: the same search); there is no end token, so both run every step, and in fp32 they must return the
same tokens, or the script fails.

The machine may be shared: every repeat times each variant once, in turn (interleaved), the tables show medians over
repeats after a warm-up, and the matmul peak is the best of a short measurement in every repeat.

Model FLOPs per train step count multiply-adds x 2 of the matmuls the task needs: B pairs of S source and T target
tokens, L_e + L_d layers, width d, feed-forward width f, vocabulary V:
    encoder      2 * B*S * L_e * (4 d^2 + 2 d f)  +  2 * B * L_e * 2 d S^2
    decoder      2 * B*T * L_d * (6 d^2 + 2 d f)  +  2 * B*S * L_d * 2 d^2       (cross-attention keys, values)
                 + 2 * B * L_d * 2 d (T(T+1)/2 + T S)                           (causal self-, cross-attention)
    generator    2 * B*T * d * V                                                 (tied to the embeddings)
training = 3 x forward.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import transformers
from bench_gpt import interleaved

from models.generation import beam_search
from models.hf.seq2seq import to_hf
from models.kernels import use_fast_kernels
from models.seq2seq import EncoderDecoder, bart_config
from pipeline.engine.training import keep_freed_memory_for_reuse


def config(args):
    return bart_config(args.size, vocab_size=args.vocab_size, max_positions=args.max_positions, dropout=0.1,
                       label_smoothing=0.0, eos_token_id=None)


def ours_and_hf(args) -> tuple[EncoderDecoder, transformers.BartForConditionalGeneration]:
    """Ours from the seed and HF's sdpa model with the same weights."""
    torch.manual_seed(0)
    ours = use_fast_kernels(EncoderDecoder(config(args)))  # as the pipeline runs it (trainer.fast_kernels)
    with tempfile.TemporaryDirectory() as hf_dir:
        to_hf(ours, hf_dir)
        hf = transformers.BartForConditionalGeneration.from_pretrained(hf_dir, attn_implementation="sdpa")
    return ours, hf


def train_flops(c, B: int, S: int, T: int) -> int:
    d, f, V = c.d_model, c.d_ff, c.vocab_size
    encoder = 2 * B * S * c.encoder_layers * (4 * d * d + 2 * d * f) + 2 * B * c.encoder_layers * 2 * d * S * S
    decoder = (2 * B * T * c.decoder_layers * (6 * d * d + 2 * d * f) + 2 * B * S * c.decoder_layers * 2 * d * d
               + 2 * B * c.decoder_layers * 2 * d * (T * (T + 1) // 2 + T * S))
    return 3 * (encoder + decoder + 2 * B * T * d * V)


def train_benchmark(args) -> list[str]:
    c = config(args)
    B, S, T = args.batch_size, args.source_len, args.target_len
    g = torch.Generator().manual_seed(0)
    source = torch.randint(3, c.vocab_size, (B, S), generator=g)
    target = torch.randint(3, c.vocab_size, (B, T + 1), generator=g)
    target[:, 0] = c.decoder_start_token_id
    decoder_inputs, targets = target[:, :-1].contiguous(), target[:, 1:].contiguous()

    def step_of(model, loss_fn):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)  # as the pipeline's

        def step():
            loss_fn().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    ours, hf = ours_and_hf(args)
    steps = {"ours": step_of(ours, lambda: ours(source, decoder_inputs, targets=targets).loss),
             "HF sdpa": step_of(hf, lambda: hf(input_ids=source, decoder_input_ids=decoder_inputs,
                                                labels=targets).loss)}
    seconds, peak = interleaved(steps, args.warmup, args.repeats, torch.float32, args.peak_seconds)
    flops = train_flops(c, B, S, T)
    lines = [f"train step, {args.size} as BART, fp32, batch {B} x ({S} -> {T}): matmul peak {peak / 1e9:.0f} GFLOP/s",
             f"{'model':10s} {'s/step':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'of peak':>8s}"]
    for name, s in seconds.items():
        lines.append(f"{name:10s} {s:8.3f} {B * (S + T) / s:9.0f} {flops / s / 1e9:8.1f} {flops / s / peak:8.1%}")
    lines.append(f"ratio train fp32: ours / HF sdpa = {seconds['HF sdpa'] / seconds['ours']:.2f}x tokens/s, ours at "
                 f"{flops / seconds['ours'] / peak:.1%} of the fp32 matmul peak")
    return lines


def generation_benchmark(args) -> list[str]:
    ours, hf = (m.eval() for m in ours_and_hf(args))
    source = torch.randint(3, ours.config.vocab_size, (1, args.source_len), generator=torch.Generator().manual_seed(1))
    n, out = args.new_tokens, {}

    def run_ours():
        out["ours"] = beam_search(ours, source[0].tolist(), n, num_beams=4, alpha=0.0)[0].tokens

    def run_hf():
        ids = hf.generate(source, attention_mask=torch.ones_like(source), max_new_tokens=n, num_beams=4,
                          length_penalty=0.0, do_sample=False, pad_token_id=ours.config.pad_token_id)
        out["HF"] = ids[0, 1:].tolist()  # less the decoder start token

    seconds, _ = interleaved({"ours": run_ours, "HF generate": run_hf}, args.warmup, args.repeats)
    if out["ours"] != out["HF"]:  # the same weights and the same search: a difference is a bug in one of the two
        first = next((i for i, (a, b) in enumerate(zip(out["ours"], out["HF"])) if a != b), min(map(len, out.values())))
        raise SystemExit(f"beam search in fp32: ours and HF generate differ from new token {first} on; the timings "
                         "compare different work")
    lines = [f"beam-4 generation, {args.size} as BART, fp32, one source of {args.source_len} tokens, {n} new tokens "
             "(the same tokens from both)",
             f"{'model':12s} {'s':>8s} {'tokens/s':>9s} {'ms/token':>9s}"]
    for name, s in seconds.items():
        lines.append(f"{name:12s} {s:8.3f} {n / s:9.1f} {1000 * s / n:9.2f}")
    lines.append(f"ratio generate fp32: ours / HF generate = {seconds['HF generate'] / seconds['ours']:.2f}x tokens/s")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    parser.add_argument("--smoke", action="store_true",
                        help="seq2seq_tiny at toy sizes, 1 repeat: checks the script runs")
    parser.add_argument("--size", default="seq2seq_small")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--source-len", type=int, default=256)
    parser.add_argument("--target-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.warmup, args.peak_seconds = 1, 1.0
    if args.quick:
        args.repeats = 2
    if args.smoke:
        args.size, args.vocab_size = "seq2seq_tiny", 512
        args.batch_size, args.source_len, args.target_len, args.new_tokens = 2, 16, 8, 6
        args.repeats, args.peak_seconds = 1, 0.05
    args.max_positions = max(args.source_len, args.target_len, args.new_tokens)
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    transformers.logging.set_verbosity_error()  # its notes on loading and generation settings
    transformers.utils.logging.disable_progress_bar()
    for benchmark in (train_benchmark, generation_benchmark):
        print("", *benchmark(args), sep="\n", flush=True)
    print(f"\n{torch.get_num_threads()} threads, median of {args.repeats} repeats after {args.warmup} warm-up; load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("targets: train >= 1.1x HF BART and >= 70% of the fp32 matmul peak; beam-4 generation >= 1.3x "
          "HF generate")


if __name__ == "__main__":
    main()
