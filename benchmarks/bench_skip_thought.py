"""Skip-Thought training-step throughput on this CPU, as a fraction of its fp32 matmul throughput measured in the
same run.

    .venv/bin/python benchmarks/bench_skip_thought.py [--quick] [--batch 32] [--length 30]

For each size (paper: Kiros et al. 2015's 2400-d uni-skip, 620-d embeddings, 20k vocabulary; small: conf/model/
skip_thought_small.yaml) it times a whole training step (encoder + both decoders + shared softmax and cross-entropy,
backward, Adam) and its parts, and converts each to achieved FLOP/s:

    FLOPs per step = 3 x forward matmul FLOPs                     (backward = grad wrt input + grad wrt weight = 2x)
    forward  = encoder:  2·T·B·3H_e·(E + H_e)      per encoder GRU (bi-skip: two GRUs with H_e = D/2)
             + decoders: 2 x [2·T·B·3H_d·(E + H_d) + 2·B·3H_d·D]   (input and recurrent gates; thought projected once)
             + softmax:  2 x 2·T·B·H_d·V                           (shared output projection, both decoders)

with every sentence T words long (no padding), B triples per batch. Elementwise work (gates, softmax normalisation,
Adam) is not counted: it is the overhead the percentages expose. The peak is the best fp32 GEMM rate (square
matrices, same threads) measured between the timed runs, so load from other processes hits both alike. Last, at the
small size, the step is repeated with the recurrences written like seed 001's Python-loop GRU (one matmul per gate
and step, plain autograd), everything else unchanged.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import MethodType

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.skip_thought import GRULayer, SkipThoughts, skip_thought_config  # noqa: E402


def best_seconds(fn, repeats: int, warmup: int = 1) -> float:
    """Minimum over `repeats` timed calls after `warmup` untimed ones: the run least disturbed by other processes."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


class MatmulPeak:
    """Best fp32 GEMM FLOP/s seen so far; `measure` is called between the timed runs."""

    def __init__(self, n: int):
        self.a, self.b = torch.randn(n, n), torch.randn(n, n)
        self.flops = 2 * n ** 3
        self.best = 0.0

    def measure(self) -> float:
        self.best = max(self.best, self.flops / best_seconds(lambda: self.a @ self.b, repeats=5))
        return self.best


def gru_flops(tokens: int, batch: int, input_size: int, hidden: int, context: int = 0) -> int:
    return 2 * tokens * 3 * hidden * (input_size + hidden) + 2 * batch * 3 * hidden * context


def forward_flops(cfg, T: int, B: int) -> dict[str, int]:
    encoders = 2 if cfg.encoder == "bi" else 1
    h_e = cfg.encoder_dim // encoders
    return {"encoder": encoders * gru_flops(T * B, B, cfg.embedding_dim, h_e),
            "decoder GRUs": 2 * gru_flops(T * B, B, cfg.embedding_dim, cfg.decoder_dim, cfg.encoder_dim),
            "softmax": 2 * 2 * T * B * cfg.decoder_dim * cfg.vocab_size}


def random_batch(cfg, T: int, B: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.full((B,), T, dtype=torch.long)
    ids = lambda: torch.randint(3, cfg.vocab_size, (B, T), generator=g)  # noqa: E731
    return {"ids": ids(), "lengths": lengths, "previous_ids": ids(), "previous_lengths": lengths,
            "next_ids": ids(), "next_lengths": lengths}


def skip_thought_loss(model: SkipThoughts, batch: dict) -> torch.Tensor:
    out = model(**batch)
    return (F.cross_entropy(out.previous.logits, out.previous.targets)
            + F.cross_entropy(out.next.logits, out.next.targets))


def seed001_gru_forward(self: GRULayer, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
    """GRULayer.forward as seed 001's `gru()` computes it: per step, a separate x·W and h·W matmul for each gate,
    then plain autograd through the loop. Same parameters, same results."""
    W_xr, W_xz, W_xh = self.input_proj.weight.chunk(3)
    b_r, b_z, b_h = self.input_proj.bias.chunk(3)
    W_hr, W_hz, W_hh = self.weight_hh.chunk(3)
    c_r, c_z, c_h = (self.context_proj(context).chunk(3, dim=1) if self.context_proj is not None else (0, 0, 0))
    bh_r, bh_z, bh_h = self.bias_hh.chunk(3)
    H = x.new_zeros(x.shape[1], self.hidden_size)
    outputs = []
    for X in x:
        Z = torch.sigmoid(X @ W_xz.t() + c_z + b_z + H @ W_hz.t() + bh_z)
        R = torch.sigmoid(X @ W_xr.t() + c_r + b_r + H @ W_hr.t() + bh_r)
        H_tilda = torch.tanh(X @ W_xh.t() + c_h + b_h + R * (H @ W_hh.t() + bh_h))
        H = Z * H + (1 - Z) * H_tilda
        outputs.append(H)
    return torch.stack(outputs)


def bench_size(name: str, encoder: str, T: int, B: int, repeats: int, peak: MatmulPeak) -> list[dict]:
    cfg = skip_thought_config(name, encoder=encoder)
    torch.manual_seed(0)
    model = SkipThoughts(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = random_batch(cfg, T, B)
    flops = {k: 3 * v for k, v in forward_flops(cfg, T, B).items()}
    label = f"{name} ({encoder}) B={B} T={T}"

    def step():
        optimizer.zero_grad(set_to_none=True)
        skip_thought_loss(model, batch).backward()
        optimizer.step()

    # Parts, on tensors of the step's shapes (requires_grad on inputs, so input gradients are computed as in the step).
    x = torch.randn(T, B, cfg.embedding_dim, requires_grad=True)
    thought = torch.randn(B, cfg.encoder_dim, requires_grad=True)
    states = torch.randn(2 * T * B, cfg.decoder_dim, requires_grad=True)
    targets = torch.randint(cfg.vocab_size, (2 * T * B,))
    encoder_grus = ([model.encoder.gru] if encoder == "uni"
                    else [model.encoder.forward_gru, model.encoder.backward_gru])

    def encoder_part():
        sum(gru(x).sum() for gru in encoder_grus).backward()

    def decoder_part():
        (model.previous_decoder(x, thought).sum() + model.next_decoder(x, thought).sum()).backward()

    def softmax_part():
        F.cross_entropy(model.output(states), targets).backward()

    step_seconds = best_seconds(step, repeats)
    rows = [{"what": f"{label}: training step", "seconds": step_seconds, "flops": sum(flops.values()),
             "sentences_per_s": B / step_seconds}]
    adam = {"what": "  Adam step", "seconds": best_seconds(optimizer.step, repeats), "flops": 0}  # grads left by step()
    for part, fn, key in (("encoder GRU fwd+bwd", encoder_part, "encoder"),
                          ("2 decoder GRUs fwd+bwd", decoder_part, "decoder GRUs"),
                          ("shared softmax + CE fwd+bwd", softmax_part, "softmax")):
        peak.measure()
        rows.append({"what": f"  {part}", "seconds": best_seconds(fn, repeats), "flops": flops[key]})
    rows.append(adam)
    rows.append({"what": "  rest (embeddings, masks, gathers, autograd glue)",
                 "seconds": step_seconds - sum(r["seconds"] for r in rows[1:]), "flops": 0})
    peak.measure()
    return rows


def bench_seed001(T: int, B: int, repeats: int) -> tuple[float, float]:
    """(ours, seed-001-style) training-step seconds at the small size."""
    cfg = skip_thought_config("skip_thought_small")
    torch.manual_seed(0)
    model = SkipThoughts(cfg)
    batch = random_batch(cfg, T, B)

    def step():
        model.zero_grad(set_to_none=True)
        skip_thought_loss(model, batch).backward()

    ours = best_seconds(step, repeats)
    with torch.no_grad():
        loss = skip_thought_loss(model, batch)
    for gru in (m for m in model.modules() if isinstance(m, GRULayer)):
        gru.forward = MethodType(seed001_gru_forward, gru)
    with torch.no_grad():
        seed_loss = skip_thought_loss(model, batch)
    if not torch.allclose(loss, seed_loss, rtol=1e-4):
        raise AssertionError(f"seed-001-style GRU computes a different loss ({seed_loss} vs {loss}): not comparable")
    seed_style = best_seconds(step, repeats)
    return ours, seed_style


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one timed repetition each (minutes, not tens of minutes)")
    parser.add_argument("--batch", type=int, default=32, help="triples per batch (paper: 128)")
    parser.add_argument("--length", type=int, default=30, help="words per sentence, incl. <eos> (paper: at most 30)")
    parser.add_argument("--encoder", choices=["uni", "bi"], default="uni")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")
    peak = MatmulPeak(1024 if args.quick else 2048)
    peak.measure()
    rows = []
    for name in ("skip_thought_paper", "skip_thought_small"):
        rows += bench_size(name, args.encoder, args.length, args.batch, repeats, peak)
    print(f"\nfp32 matmul peak (best square GEMM this run): {peak.best / 1e9:.1f} GFLOP/s\n")
    print(f"{'':58s} {'ms':>9s} {'GFLOP/s':>8s} {'% peak':>7s} {'sent/s':>7s}")
    for r in rows:
        rate = r["flops"] / r["seconds"] if r["flops"] else 0.0
        pct = f"{100 * rate / peak.best:6.1f}%" if r["flops"] else ""
        sps = f"{r['sentences_per_s']:7.1f}" if "sentences_per_s" in r else ""
        print(f"{r['what']:58s} {1e3 * r['seconds']:9.1f} {rate / 1e9:8.1f} {pct:>7s} {sps:>7s}")
    ours, seed_style = bench_seed001(args.length, args.batch, repeats)
    print(f"\nskip_thought_small fwd+bwd, B={args.batch} T={args.length}: GRULayer {1e3 * ours:.1f} ms, "
          f"seed-001-style Python-loop GRU {1e3 * seed_style:.1f} ms -> {seed_style / ours:.2f}x faster")


if __name__ == "__main__":
    main()
