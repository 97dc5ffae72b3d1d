"""biLM training-step throughput: tokens/s and achieved FLOP/s as a fraction of this CPU's fp32 matmul throughput,
both measured in this run, at elmo_original shapes and at elmo_small; plus elmo_small with its LSTMs replaced by a
Python loop over time steps written like seed 001's from-scratch LSTM.

    python benchmarks/bench_elmo.py            # ~5 timed steps per row
    python benchmarks/bench_elmo.py --quick    # 2 timed steps per row

FLOP formula (matmul/convolution multiply-adds x 2 only; element-wise work is not counted). Per window, with
N = B * T positions per direction, P = projection_dim, C = lstm_dim, F = total filters, E = char_embedding_dim,
W = max_characters_per_token, V_eff = vocabulary (full softmax) or num_samples + 1 (sampled):
    char-CNN      2 * (2N) * sum_widths (W - w + 1) * w * E * count_w
    highway       2 * (2N) * F * 2F per highway layer;  projection  2 * (2N) * F * P
    LSTMs         2 * (2N) * L * (P * 4C [input] + P * 4C [recurrent] + C * P [projection])
    softmax       2 * (2N) * P * V_eff
forward = the sum; a training step (forward + backward: input and weight gradients) = 3 x forward.
Tokens/s counts N (each position is predicted once by each direction). The timed step is forward + backward;
the optimizer update (memory-bound, outside the FLOP count) is left out. The process runs with the pipeline's
allocator setting (pipeline.engine.training.keep_freed_memory_for_reuse), as ELMo pretraining does.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from models.elmo import N_CHARACTERS, BiLanguageModel, ElmoConfig, elmo_config
from pipeline.engine.training import keep_freed_memory_for_reuse


def forward_flops(config: ElmoConfig, batch_size: int, window: int) -> int:
    rows = 2 * batch_size * window  # both directions go through the shared encoder and softmax
    P, C, W = config.projection_dim, config.lstm_dim, config.max_characters_per_token
    flops = 0
    if config.token_encoder == "char_cnn":
        F_ = config.num_filters
        flops += sum(2 * rows * (W - w + 1) * w * config.char_embedding_dim * n for w, n in config.filters)
        flops += config.num_highway_layers * 2 * rows * F_ * 2 * F_ + 2 * rows * F_ * P
    flops += 2 * rows * config.num_layers * (2 * P * 4 * C + C * P)
    v_eff = config.num_samples + 1 if config.softmax == "sampled" else config.vocab_size
    return flops + 2 * rows * P * v_eff


def matmul_flops_per_s(seconds: float, n: int = 2048) -> float:
    """Best fp32 torch.mm throughput of n x n matrices within `seconds`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best, deadline = 0.0, time.perf_counter() + seconds
    torch.mm(a, b)
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - start))
    return best


class Seed001LSTM(nn.Module):
    """Seed 001's from-scratch LSTM (one matmul per gate and input, a Python loop over time steps), with a projection
    of h added so that it drops into LstmStack in place of nn.LSTM(proj_size=P); same call signature."""

    def __init__(self, input_size: int, hidden_size: int, proj_size: int):
        super().__init__()

        def gate():
            return (nn.Parameter(torch.randn(input_size, hidden_size) * 0.01),
                    nn.Parameter(torch.randn(proj_size, hidden_size) * 0.01), nn.Parameter(torch.zeros(hidden_size)))

        self.W_xi, self.W_hi, self.b_i = gate()
        self.W_xf, self.W_hf, self.b_f = gate()
        self.W_xo, self.W_ho, self.b_o = gate()
        self.W_xc, self.W_hc, self.b_c = gate()
        self.W_hr = nn.Parameter(torch.randn(hidden_size, proj_size) * 0.01)
        self.hidden_size, self.proj_size = hidden_size, proj_size

    def forward(self, inputs: torch.Tensor, state=None):
        B = inputs.shape[0]
        if state is None:
            H, C = inputs.new_zeros(B, self.proj_size), inputs.new_zeros(B, self.hidden_size)
        else:
            H, C = state[0][0], state[1][0]
        outputs = []
        for X in inputs.unbind(1):
            I = torch.sigmoid(torch.matmul(X, self.W_xi) + torch.matmul(H, self.W_hi) + self.b_i)
            F = torch.sigmoid(torch.matmul(X, self.W_xf) + torch.matmul(H, self.W_hf) + self.b_f)
            O = torch.sigmoid(torch.matmul(X, self.W_xo) + torch.matmul(H, self.W_ho) + self.b_o)
            C_tilda = torch.tanh(torch.matmul(X, self.W_xc) + torch.matmul(H, self.W_hc) + self.b_c)
            C = F * C + I * C_tilda
            H = torch.matmul(O * C.tanh(), self.W_hr)
            outputs.append(H)
        return torch.stack(outputs, 1), (H[None], C[None])


def with_seed001_lstms(model: BiLanguageModel) -> BiLanguageModel:
    c = model.config
    for stack in (model.forward_lstm, model.backward_lstm):
        for i in range(len(stack.layers)):
            stack.layers[i] = Seed001LSTM(c.projection_dim, c.lstm_dim, c.projection_dim)
    return model


def seconds_per_step(model: BiLanguageModel, batch_size: int, window: int, steps: int) -> float:
    """Median seconds of forward + backward over `steps` windows (after one warm-up), state carried as in training."""
    c, gen = model.config, torch.Generator().manual_seed(0)
    chars = torch.randint(1, N_CHARACTERS, (2, batch_size, window, c.max_characters_per_token), generator=gen)
    targets = torch.randint(0, c.vocab_size, (2, batch_size, window), generator=gen)
    model.train()
    state, times = None, []
    for step in range(steps + 1):
        start = time.perf_counter()
        out = model(chars[0], chars[1], targets[0], targets[1], state=state)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        state = tuple([(h.detach(), c_.detach()) for h, c_ in d] for d in out.state)
        if step:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 timed steps per row instead of 5")
    parser.add_argument("--batch-size", type=int, default=64, help="B (bilm-tf: 128 per GPU; 64 fits this CPU)")
    parser.add_argument("--window", type=int, default=20, help="T, bilm-tf's unroll_steps")
    parser.add_argument("--original-vocab", type=int, default=793471, help="the paper's (1B Word Benchmark) vocab")
    parser.add_argument("--small-vocab", type=int, default=20000, help="elmo_small's output vocabulary")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    steps = 2 if args.quick else 5
    B, T = args.batch_size, args.window
    torch.manual_seed(0)

    peak = matmul_flops_per_s(3.0 if args.quick else 6.0)
    print(f"fp32 matmul peak (2048^3 torch.mm, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s\n")
    rows = []
    for name, model in (
            ("elmo_original", BiLanguageModel(elmo_config("elmo_original", vocab_size=args.original_vocab))),
            ("elmo_small", BiLanguageModel(elmo_config("elmo_small", vocab_size=args.small_vocab))),
            ("elmo_small, seed-001 loop LSTM",
             with_seed001_lstms(BiLanguageModel(elmo_config("elmo_small", vocab_size=args.small_vocab))))):
        seconds = seconds_per_step(model, B, T, steps)
        flops = 3 * forward_flops(model.config, B, T)
        rows.append((name, seconds, B * T / seconds, flops / seconds))
        del model
    # Matmul peak again after the runs: the machine is shared, so report against the better of the two.
    peak = max(peak, matmul_flops_per_s(3.0 if args.quick else 6.0))
    print(f"B={B} T={T}, forward + backward per step, median of {steps}")
    print(f"{'model':34s} {'s/step':>8s} {'tokens/s':>10s} {'GFLOP/s':>9s} {'of peak':>8s}")
    for name, seconds, tokens, achieved in rows:
        print(f"{name:34s} {seconds:8.3f} {tokens:10.0f} {achieved / 1e9:9.1f} {achieved / peak:8.1%}")
    print(f"\nour projected LSTM (elmo_small) vs seed-001 loop: {rows[2][1] / rows[1][1]:.2f}x faster")
    print(f"elmo_original: {rows[0][3] / peak:.1%} of matmul peak (target >= 55%)")


if __name__ == "__main__":
    main()
