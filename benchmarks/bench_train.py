"""BERT pretraining train-step throughput: ours (models.bert) against transformers.BertForPreTraining (eager and sdpa
attention) at the same config, batch, sequence length and thread count, in fp32 and in bf16 autocast, measured in
this run next to this CPU's fp32 and bf16 matmul throughput.

    python benchmarks/bench_train.py                  # bert_mini and bert_base, 5 timed steps per row, + torch.compile
    python benchmarks/bench_train.py --quick          # 2 timed steps per row, no torch.compile
    python benchmarks/bench_train.py --loss-curve 600 # bert_mini fp32 vs bf16 on learnable synthetic data
    python benchmarks/bench_train.py --short-seq-prob 0.1  # padded batches as google-research/bert's data makes them
    python benchmarks/bench_train.py --sentence-batches 64  # bert_tiny fine-tuning steps on batches of sentences

A step is forward + MLM/NSP loss + backward + fused AdamW update (both sides) + zero_grad, timed as the median of
the steps after warm-up (the machine may be shared: the load average is printed with the table). The pipeline's
allocator setting (pipeline.engine.training.keep_freed_memory_for_reuse) is made once for the whole process, so HF's
rows run with it too.

Model FLOPs per step count only the work the task needs (multiply-adds x 2; element-wise work not counted), with
B sequences of T tokens, M = B x P masked positions, L layers, H hidden, I feed-forward width, V vocabulary:
    encoder matmuls   2 * B*T * L * (4H^2 + 2HI)        (Q, K, V, output projections and the feed-forward)
    attention         2 * B * L * 2 * T^2 * H            (Q K^T and probabilities x V)
    MLM head          2 * M * (H^2 + H V)                (transform and tied decoder at the masked positions only)
    pooler + NSP      2 * B * (H^2 + 2H)
training = 3 x forward (backward computes input and weight gradients). So per token 6 x the encoder's matmul
parameters, per sequence 12 L T^2 H for attention. HF computes the MLM head at all B*T positions; that extra work is
not counted, so skipping it shows up as speed, not as a higher fraction of peak. With --short-seq-prob some sequences
are shorter than T and padded, as in real pretraining batches: then B*T counts the real tokens only (attention is
still counted over T^2), tokens/s are real tokens per second, and ours skipping the padding outside attention
(models.kernels.RealTokens) is speed too. "ours, kernels off" is the same model without use_fast_kernels: what
models/kernels.py buys.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from contextlib import nullcontext

import torch

from models import IGNORE_INDEX
from models.bert import BertForPreTraining, bert_config
from models.kernels import use_fast_kernels
from pipeline.bert.module import BertPretrainModule
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.training import cpu_computes_bf16, keep_freed_memory_for_reuse

VOCAB_SIZE = 30522  # BERT's WordPiece vocabulary, as in the paper's models
MAX_PREDICTIONS = 20  # google-research/bert's max_predictions_per_seq at length 128


def matmul_flops_per_s(dtype: torch.dtype, seconds: float, n: int = 2048) -> float:
    """Best torch.mm throughput on n x n matrices of `dtype` within `seconds`."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - start))
    return best


def step_flops(size: str, batch_size: int, seq_len: int, tokens: int | None = None, masked: int | None = None) -> int:
    """tokens, masked: the batch's real tokens and masked positions, when not every sequence is full."""
    c = bert_config(size, vocab_size=VOCAB_SIZE)
    L, H, I, V = c.num_hidden_layers, c.hidden_size, c.intermediate_size, VOCAB_SIZE
    tokens = batch_size * seq_len if tokens is None else tokens
    masked = batch_size * MAX_PREDICTIONS if masked is None else masked
    forward = (2 * tokens * L * (4 * H * H + 2 * H * I) + 2 * batch_size * L * 2 * seq_len ** 2 * H
               + 2 * masked * (H * H + H * V) + 2 * batch_size * (H * H + 2 * H))
    return 3 * forward


def sequence_lengths(batch_size: int, seq_len: int, short_seq_prob: float) -> list[int]:
    """google-research/bert's create_pretraining_data gives a share short_seq_prob of its instances a target length
    drawn uniformly from [2, T] (the rest fill T): here that share of the batch, rounded, gets lengths spread evenly
    over that range (so a batch of 8 is as padded as the average batch), the others are full."""
    num_short = round(batch_size * short_seq_prob)
    short = [2 + round((seq_len - 2) * (i + 0.5) / num_short) for i in range(num_short)]
    return short + [seq_len] * (batch_size - num_short)


def make_batch(batch_size: int, seq_len: int, seed: int = 0, short_seq_prob: float = 0.0) -> dict:
    """Sentence pairs with up to MAX_PREDICTIONS distinct masked positions per sequence (15 % of its tokens, none at
    [CLS]; unused slots are label IGNORE_INDEX), padded to seq_len where sequence_lengths makes them shorter."""
    g = torch.Generator().manual_seed(seed)
    lengths = sequence_lengths(batch_size, seq_len, short_seq_prob)
    positions = torch.zeros(batch_size, MAX_PREDICTIONS, dtype=torch.long)
    mlm_labels = torch.full((batch_size, MAX_PREDICTIONS), IGNORE_INDEX)
    for row, length in enumerate(lengths):
        n = min(MAX_PREDICTIONS, max(1, round(0.15 * length)))
        positions[row, :n] = (torch.randperm(length - 1, generator=g)[:n] + 1).sort().values
        mlm_labels[row, :n] = torch.randint(5, VOCAB_SIZE, (n,), generator=g)
    # HF's layout; unused slots point at [CLS] (position 0) with label IGNORE_INDEX (HF's default ignore_index too)
    dense_labels = torch.full((batch_size, seq_len), IGNORE_INDEX).scatter(1, positions, mlm_labels)
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    second_segment = (torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, seq_len)
    return {"input_ids": torch.randint(5, VOCAB_SIZE, (batch_size, seq_len), generator=g) * attention_mask,
            "token_type_ids": second_segment * attention_mask,
            "attention_mask": attention_mask,
            "mlm_positions": positions, "mlm_labels": mlm_labels, "dense_labels": dense_labels,
            "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)}


def ours(size: str, compiled: bool, fast_kernels: bool = True):
    model = BertForPreTraining(bert_config(size, vocab_size=VOCAB_SIZE))
    if fast_kernels:  # as the pipeline builds it (trainer.fast_kernels); without: the model as models/bert.py writes it
        use_fast_kernels(model)
    objective = BertPretrainModule(model, OptimizerSettings("pretrain", "adamw", lr=1e-4, weight_decay=0.01,
                                                            betas=(0.9, 0.999), warmup_steps=1, max_steps=1,
                                                            lr_decay="linear"))
    step = torch.compile(objective.model_step) if compiled else objective.model_step
    return model, lambda batch: step(batch)["loss"]


def huggingface(size: str, attn_implementation: str):
    import transformers

    c = bert_config(size, vocab_size=VOCAB_SIZE)
    hf_config = transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings, layer_norm_eps=c.layer_norm_eps)
    model = transformers.BertForPreTraining._from_config(hf_config, attn_implementation=attn_implementation)

    def loss(batch):
        return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"], labels=batch["dense_labels"],
                     next_sentence_label=batch["next_sentence_label"]).loss

    return model, loss


def time_steps(model, loss_fn, batch: dict, bf16: bool, warmup: int, steps: int) -> tuple[float, float]:
    """(seconds of the first step, which includes any compilation; median seconds of the timed steps)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)  # as the pipeline's
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        with autocast:
            loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[warmup:])


def benchmark(args) -> None:
    dtypes = [("fp32", False)] + ([("bf16", True)] if cpu_computes_bf16() else [])
    if not cpu_computes_bf16():
        print("this CPU has no native bf16 (AMX / AVX512-BF16): bf16 rows skipped\n")
    peak_seconds = 2.0 if args.quick else 5.0
    peaks = {name: matmul_flops_per_s(torch.bfloat16 if bf16 else torch.float32, peak_seconds)
             for name, bf16 in dtypes}
    warmup, steps = (1, 2) if args.quick else (2, 5)
    B, T = args.batch_size, args.seq_len
    batch = make_batch(B, T, short_seq_prob=args.short_seq_prob)
    real_tokens, masked = int(batch["attention_mask"].sum()), int((batch["mlm_labels"] != IGNORE_INDEX).sum())
    variants = [("ours", lambda s: ours(s, compiled=False)),
                ("ours, kernels off", lambda s: ours(s, compiled=False, fast_kernels=False)),
                ("HF eager", lambda s: huggingface(s, "eager")), ("HF sdpa", lambda s: huggingface(s, "sdpa"))]
    if args.compile:
        variants.insert(1, ("ours + torch.compile", lambda s: ours(s, compiled=True)))
    rows = []
    for size in args.sizes:
        flops = step_flops(size, B, T, real_tokens, masked)
        for dtype, bf16 in dtypes:
            for name, build in variants:
                torch.manual_seed(0)
                model, loss_fn = build(size)
                first, seconds = time_steps(model, loss_fn, batch, bf16, warmup + ("compile" in name), steps)
                rows.append({"size": size, "dtype": dtype, "name": name, "first": first, "seconds": seconds,
                             "tokens": real_tokens / seconds, "flops": flops / seconds})
                print(f"  {size} {dtype} {name}: {seconds:.3f} s/step (first step {first:.1f} s)", flush=True)
                del model, loss_fn
    # Again after the runs, as the machine is shared: the better of the two is the reference.
    peaks = {name: max(peaks[name], matmul_flops_per_s(torch.bfloat16 if bf16 else torch.float32, peak_seconds))
             for name, bf16 in dtypes}

    padding = f" ({B * T - real_tokens} of the {B * T} positions padding)" if real_tokens < B * T else ""
    print(f"\nbatch {B} x seq {T}{padding}, {torch.get_num_threads()} threads, median of {steps} steps after {warmup} "
          f"warm-up; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("matmul peak (2048^3 torch.mm): " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peaks.items()))
    print(f"{'size':10s} {'dtype':5s} {'model':22s} {'s/step':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'of peak':>8s}"
          f" {'vs HF best':>10s} {'1st step s':>10s}")
    for r in rows:
        same = [x for x in rows if x["size"] == r["size"] and x["dtype"] == r["dtype"]]
        hf_best = max(x["tokens"] for x in same if x["name"].startswith("HF"))
        print(f"{r['size']:10s} {r['dtype']:5s} {r['name']:22s} {r['seconds']:8.3f} {r['tokens']:9.0f} "
              f"{r['flops'] / 1e9:8.1f} {r['flops'] / peaks[r['dtype']]:8.1%} {r['tokens'] / hf_best:9.2f}x "
              f"{r['first']:10.1f}")
    for size in args.sizes:
        for dtype, _ in dtypes:
            t = {r["name"]: r["tokens"] for r in rows if r["size"] == size and r["dtype"] == dtype}
            print(f"{size} {dtype}: models/kernels.py on / off = {t['ours'] / t['ours, kernels off']:.2f}x")
    if len(dtypes) == 2:
        for size in args.sizes:
            for name, _ in variants:
                if not name.startswith("HF"):
                    t = {r["dtype"]: r["tokens"] for r in rows if r["size"] == size and r["name"] == name}
                    print(f"{size} {name}: bf16 / fp32 = {t['bf16'] / t['fp32']:.2f}x")
    print("targets: ours >= 1.3x HF's faster mode per dtype; bert_base fp32 >= 75% of fp32 peak; bf16 >= 2.5x fp32")


# The loss-curve task: TOPICS disjoint lists of WORDS_PER_TOPIC word ids after the 5 special ids.
TOPICS, WORDS_PER_TOPIC = 16, 32


def learnable_batch(g: torch.Generator, batch_size: int, seq_len: int) -> dict:
    """Segments of words drawn from one topic's list: a masked word is one of its topic's WORDS_PER_TOPIC words, which
    the other words of its segment reveal, so the MLM loss falls from ln V towards ln WORDS_PER_TOPIC once attention
    pools the segment (within a few hundred steps; a task that needs positional attention patterns, like a Markov
    chain, barely moves in that time). The second segment keeps the topic (label 0, "is next") or switches to another
    one (label 1)."""
    half = seq_len // 2
    is_random = torch.randint(0, 2, (batch_size,), generator=g)
    first = torch.randint(0, TOPICS, (batch_size,), generator=g)
    second = torch.where(is_random.bool(), (first + torch.randint(1, TOPICS, (batch_size,), generator=g)) % TOPICS,
                         first)
    topic = torch.cat([first[:, None].expand(-1, half), second[:, None].expand(-1, seq_len - half)], dim=1)
    ids = 5 + topic * WORDS_PER_TOPIC + torch.randint(0, WORDS_PER_TOPIC, (batch_size, seq_len), generator=g)
    positions = torch.stack([torch.randperm(seq_len - 1, generator=g)[:MAX_PREDICTIONS // 2] + 1
                             for _ in range(batch_size)])
    labels = ids.gather(1, positions)
    masked = ids.scatter(1, positions, 4)  # 4 stands for [MASK]
    return {"input_ids": masked, "token_type_ids": (torch.arange(seq_len) >= half).long().expand(batch_size, seq_len),
            "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long), "mlm_positions": positions,
            "mlm_labels": labels, "next_sentence_label": is_random}


def loss_curve(args) -> None:
    """bert_mini trained from the same weights on the same batches in fp32 and in bf16 autocast, and once more in fp32
    with other dropout masks: that run's distance from the first is the noise the bf16 curve is judged against."""
    if not cpu_computes_bf16():
        raise SystemExit("this CPU has no native bf16 (AMX / AVX512-BF16); there is no bf16 curve to compare")
    vocab, B, T = 5 + TOPICS * WORDS_PER_TOPIC, 16, 64
    curves = {}
    for name, bf16, dropout_seed in (("fp32", False, None), ("bf16", True, None), ("fp32, other dropout", False, 1)):
        torch.manual_seed(0)
        settings = OptimizerSettings("pretrain", "adamw", lr=1e-3, weight_decay=0.01, betas=(0.9, 0.999),
                                     warmup_steps=args.loss_curve // 10, max_steps=args.loss_curve, lr_decay="linear")
        module = BertPretrainModule(use_fast_kernels(BertForPreTraining(bert_config("bert_mini", vocab_size=vocab))),
                                    settings)
        if dropout_seed is not None:
            torch.manual_seed(dropout_seed)  # same initial weights and batches, other dropout masks
        optimization = module.configure_optimizers()
        optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        g, losses, started = torch.Generator().manual_seed(1), [], time.perf_counter()
        for _ in range(args.loss_curve):
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = module.model_step(learnable_batch(g, B, T))["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves[name] = losses
        print(f"{name}: {args.loss_curve} steps in {time.perf_counter() - started:.0f} s, loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}", flush=True)
    window = 20
    smooth = {k: [sum(v[i:i + window]) / window for i in range(len(v) - window + 1)] for k, v in curves.items()}
    print(f"smoothed ({window}-step mean) losses; uniform guess MLM {math.log(vocab):.2f} + NSP {math.log(2):.2f}, "
          f"topics learnt MLM {math.log(WORDS_PER_TOPIC):.2f} + NSP 0; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for other in ("bf16", "fp32, other dropout"):
        rel = [abs(a - b) / a for a, b in zip(smooth["fp32"], smooth[other])]
        print(f"  fp32 vs {other}: relative difference mean {statistics.mean(rel):.2%}, max {max(rel):.2%} at window "
              f"{rel.index(max(rel))}; final {smooth['fp32'][-1]:.3f} vs {smooth[other][-1]:.3f}")


def sentence_batches(args) -> None:
    """Fine-tuning steps of make run's classifier (bert_tiny, relative positions, pre-LN, mean pooling, dropout 0.1) on
    batches of 32 sentences whose lengths change from batch to batch, as Rotten Tomatoes' do (8-64 tokens): fp32, bf16
    autocast with every batch's exact shapes (the baseline: oneDNN builds its bf16 kernels per shape), and bf16 with
    the model's rounded shapes (models.kernels.PACKED_ROW_MULTIPLE and PADDED_LENGTH_MULTIPLE). `--device cuda`: the
    same rows on a GPU, whose autocast the model leaves at the exact shapes (models.kernels.ROUNDED_SHAPE_DEVICES): the
    rounded row rounds them there for this comparison."""
    from models import kernels
    from models.bert import BertForSequenceClassification

    device = torch.device(args.device)
    if device.type == "cpu" and not cpu_computes_bf16():
        raise SystemExit("this CPU has no native bf16 (AMX / AVX512-BF16): no bf16 rows to compare")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(args.sentence_batches):
        longest = int(torch.randint(12, 65, (), generator=g))
        lengths = torch.randint(longest // 2, longest + 1, (32,), generator=g)
        lengths[0] = longest
        mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
        batches.append(tuple(t.to(device) for t in (torch.randint(5, 8000, (32, longest), generator=g) * mask, mask,
                                                    torch.randint(0, 2, (32,), generator=g))))
    rounded = kernels.PACKED_ROW_MULTIPLE, kernels.PADDED_LENGTH_MULTIPLE
    rounding_devices = kernels.ROUNDED_SHAPE_DEVICES
    kernels.ROUNDED_SHAPE_DEVICES = (device.type,)
    rows = {}
    for name, bf16, multiples in (("fp32", False, rounded), ("bf16, exact shapes", True, (1, 1)),
                                  ("bf16, rounded shapes", True, rounded)):
        kernels.PACKED_ROW_MULTIPLE, kernels.PADDED_LENGTH_MULTIPLE = multiples
        torch.manual_seed(0)
        config = bert_config("bert_tiny", vocab_size=8000, position_embedding_type="relative", pre_layer_norm=True)
        model = kernels.use_fast_kernels(BertForSequenceClassification(config, num_labels=2, pooling="mean"))
        model = model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
        times = []
        for epoch in range(2):  # the first pass over the batches meets every shape once: timed, not the reference
            synchronize()
            started = time.perf_counter()
            for input_ids, mask, labels in batches:
                with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext():
                    logits = model(input_ids, torch.zeros_like(input_ids), mask)
                torch.nn.functional.cross_entropy(logits.float(), labels).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            synchronize()
            times.append((time.perf_counter() - started) / len(batches))
        rows[name] = times
        print(f"  {name}: {times[0] * 1e3:.1f} ms/step in the first pass, {times[1] * 1e3:.1f} in the second",
              flush=True)
    kernels.PACKED_ROW_MULTIPLE, kernels.PADDED_LENGTH_MULTIPLE = rounded
    kernels.ROUNDED_SHAPE_DEVICES = rounding_devices
    print(f"\nbert_tiny classifier, {args.sentence_batches} batches of 32 sentences of 8-64 tokens, "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else f'{torch.get_num_threads()} threads'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, (first, second) in rows.items():
        print(f"{name:22s} {second * 1e3:7.1f} ms/step (first pass {first * 1e3:.1f}); "
              f"{rows['bf16, exact shapes'][1] / second:.2f}x the exact-shape bf16 step, "
              f"{rows['fp32'][1] / second:.2f}x fp32's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 timed steps per row, no torch.compile rows")
    parser.add_argument("--sizes", nargs="+", default=["bert_mini", "bert_base"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--short-seq-prob", type=float, default=0.0,
                        help="share of the batch's sequences shorter than --seq-len and padded (google-research/bert: "
                             "0.1); default: all full length")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="add a torch.compile row for ours (default: on, off with --quick)")
    parser.add_argument("--sentence-batches", type=int, metavar="N",
                        help="instead: bert_tiny fine-tuning steps on N batches of sentences of changing lengths, "
                             "fp32 and bf16 with exact and rounded shapes")
    parser.add_argument("--device", default="cpu", help="with --sentence-batches: cpu, or cuda for a GPU")
    parser.add_argument("--loss-curve", type=int, metavar="STEPS",
                        help="instead of timing: train bert_mini STEPS steps in fp32 and bf16 and compare the losses")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    if args.compile is None:
        args.compile = not args.quick
    if args.sentence_batches:
        sentence_batches(args)
    elif args.loss_curve:
        loss_curve(args)
    else:
        benchmark(args)


if __name__ == "__main__":
    main()
