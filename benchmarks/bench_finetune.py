"""Fine-tuning throughput of make run's classifier (bert_tiny: 2 layers, 128 wide, relative positions, pre-LN, mean
pooling, dropout 0.1, a 32,000-piece vocabulary) on batches of 32 sentences grouped by length as the fine-tune stage
groups them, in the precision the pipeline picks on this CPU (bf16 autocast where it computes bf16, else fp32), each
row measured in this run on the same batches:

    pipeline        finetune_once's Trainer (pipeline.engine.training.make_trainer) and ClassificationModule: what
                    the fine-tune stage runs, the baseline of the ratios
    plain loop      the same model, module step and optimizer in a bare PyTorch loop: what the framework costs
    HF Trainer      transformers' BertForSequenceClassification of the same shape and positions (relative_key) under
                    transformers.Trainer with the same optimizer settings
    2 x 1 thread    two plain loops at once in two processes of one thread each: what training two runs side by side,
                    one per core, gives in steps per second together

A step is forward, loss, backward, AdamW and zero_grad, timed over the steps after a warm-up (the first batches of
each shape build oneDNN's kernels). Model FLOPs count the real tokens (the model's matmuls skip padding), B sentences
of T tokens padded, L layers, H hidden, I feed-forward width: training = 3 x (2 * tokens * L * (4H^2 + 2HI) +
2 * B * L * 2 * T^2 * H). `embeddings`: frozen as `bert`'s (the default) or trained as the random twin's.

    python benchmarks/bench_finetune.py                 # 400 steps a row (make bench-finetune)
    python benchmarks/bench_finetune.py --steps 60      # a quick look
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import lightning as L
import numpy as np
import torch
from bench_train import matmul_flops_per_s  # benchmarks/ is the script's directory, first on sys.path

from models.bert import BertForSequenceClassification, bert_config
from pipeline.downstream.modules import ClassificationModule
from pipeline.downstream.task_data import length_grouped_batches
from pipeline.engine.training import keep_freed_memory_for_reuse, resolve_precision

VOCAB_SIZE = 32_000  # bert_tiny's WordPiece vocabulary in make run
BATCH_SIZE = 32
MAX_LENGTH = 64  # finetune.max_seq_length
MEAN_LENGTH = 31  # Rotten Tomatoes' sentences, in tokens with [CLS] and [SEP]
LR, WEIGHT_DECAY, WARMUP_FRACTION = 1e-3, 0.01, 0.1  # the fine-tune block's defaults
WARMUP_STEPS = 30  # untimed: every batch length has been seen once by then


def sentence_batches(steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`steps` batches of BATCH_SIZE sentences with lengths spread as Rotten Tomatoes' (gamma, mean MEAN_LENGTH, cut
    to 5..MAX_LENGTH), grouped by length as finetune.group_by_length does, padded as pad_classification_batch pads."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.gamma(4.0, MEAN_LENGTH / 4.0, steps * BATCH_SIZE).round().astype(int), 5, MAX_LENGTH)
    batches = []
    for rows in length_grouped_batches(lengths, BATCH_SIZE, rng):
        longest = int(lengths[rows].max())
        mask = torch.as_tensor(np.arange(longest)[None, :] < lengths[rows][:, None]).long()
        ids = torch.as_tensor(rng.integers(5, VOCAB_SIZE, (len(rows), longest))) * mask
        batches.append({"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
                        "labels": torch.as_tensor(rng.integers(0, 2, len(rows)))})
    return batches


def step_flops(batch: dict[str, torch.Tensor]) -> int:
    c = bert_config("bert_tiny")
    L_, H, I = c.num_hidden_layers, c.hidden_size, c.intermediate_size
    B, T = batch["input_ids"].shape
    tokens = int(batch["attention_mask"].sum())
    return 3 * (2 * tokens * L_ * (4 * H * H + 2 * H * I) + 2 * B * L_ * 2 * T * T * H)


def classifier(frozen_embeddings: bool) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = bert_config("bert_tiny", vocab_size=VOCAB_SIZE, max_position_embeddings=128,
                         position_embedding_type="relative", pre_layer_norm=True, hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1)
    model = BertForSequenceClassification(config, 2, pooling="mean")
    model.bert.embeddings.word_embeddings.weight.requires_grad_(not frozen_embeddings)
    return model


def module_for(model, steps: int) -> ClassificationModule:
    return ClassificationModule(model, metric="accuracy", lr=LR, weight_decay=WEIGHT_DECAY,
                                warmup_steps=int(WARMUP_FRACTION * steps), total_steps=steps)


class StepClock(L.Callback):
    """The wall time of the training steps after WARMUP_STEPS."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == WARMUP_STEPS:
            self.started = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds = time.perf_counter() - self.started


def pipeline_row(batches, precision: str, frozen: bool) -> float:
    """Seconds per step of finetune_once's Trainer: the `trainer` block of make run's config, as make_trainer builds it
    (progress lines, memory release, the CSV logger), one process."""
    from hydra import compose, initialize_config_dir

    import pipeline.config  # noqa: F401  registers the config schema that conf/config.yaml composes with
    from pipeline import CONF_DIR
    from pipeline.engine.dag import StageContext, plain_config
    from pipeline.engine.training import make_trainer

    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "+experiment=bert_tiny", f"paths.run_dir={tmp}", f"paths.cache_dir={tmp}/cache", "logger=csv",
            f"trainer.precision={precision}"])
        ctx = StageContext(plain_config(cfg), "finetune", Path(tmp), {})
        clock = StepClock()
        trainer = make_trainer(ctx, [clock], prefix="bench", one_process=True, max_epochs=1, num_sanity_val_steps=0,
                               enable_checkpointing=False, limit_val_batches=0)
        loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
        trainer.fit(module_for(classifier(frozen), len(batches)), loader)
    return clock.seconds / (len(batches) - WARMUP_STEPS)


def plain_loop_row(batches, precision: str, frozen: bool) -> float:
    """Seconds per step of the same module's step and optimizer without Lightning."""
    module = module_for(classifier(frozen), len(batches))
    configured = module.configure_optimizers()  # Lightning's {"optimizer": ..., "lr_scheduler": {"scheduler": ...}}
    optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else nullcontext()
    module.train()
    started = None
    for index, batch in enumerate(batches):
        if index == WARMUP_STEPS:
            started = time.perf_counter()
        with autocast:
            loss = module.model_step(batch)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
    return (time.perf_counter() - started) / (len(batches) - WARMUP_STEPS)


def hf_trainer_row(batches, precision: str, frozen: bool) -> float:
    """Seconds per step of transformers.Trainer on HF's BertForSequenceClassification of bert_tiny's shape (relative_key
    positions, Shaw et al. as ours; [CLS] pooling, HF's only one), same batches, AdamW, lr, schedule and precision."""
    import transformers

    c = bert_config("bert_tiny")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=128, position_embedding_type="relative_key", num_labels=2))
    model.bert.embeddings.word_embeddings.weight.requires_grad_(not frozen)

    class StepClockHF(transformers.TrainerCallback):  # StepClock's times, from transformers' callback hooks
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == WARMUP_STEPS:
                self.started = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            self.seconds = time.perf_counter() - self.started

    clock = StepClockHF()
    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=1, num_train_epochs=1, learning_rate=LR,
            weight_decay=WEIGHT_DECAY, warmup_steps=int(WARMUP_FRACTION * len(batches)), lr_scheduler_type="linear",
            bf16=precision == "bf16-mixed", use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, optim="adamw_torch_fused")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_OneBatchEach(batches),
                                       data_collator=lambda items: items[0], callbacks=[clock])
        trainer.train()
    return clock.seconds / (len(batches) - WARMUP_STEPS)


class _OneBatchEach(torch.utils.data.Dataset):
    """The prepared batches, one per item, in order (HF's sampler shuffles item order, which changes nothing timed)."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


def _one_thread_plain_loop(args) -> float:
    steps, precision, frozen = args
    torch.set_num_threads(1)
    keep_freed_memory_for_reuse()
    return plain_loop_row(sentence_batches(steps), precision, frozen)


def two_processes_row(steps: int, precision: str, frozen: bool) -> float:
    """Seconds per step of two single-thread plain loops run at once, counted together (2 steps per wall step)."""
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        per_step = pool.map(_one_thread_plain_loop, [(steps, precision, frozen)] * 2)
    return max(per_step) / 2


ROWS = {"pipeline": pipeline_row, "plain loop": plain_loop_row, "HF Trainer": hf_trainer_row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per row, the first 30 untimed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embeddings", choices=("frozen", "trained"), default="frozen",
                        help="frozen as bert's in make run, or trained as its random twin's")
    parser.add_argument("--precision", default="auto", help="auto: what the pipeline picks on this CPU")
    parser.add_argument("--rows", nargs="+", default=[*ROWS, "2 x 1 thread"], choices=[*ROWS, "2 x 1 thread"])
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS:
        raise SystemExit(f"--steps must be more than the {WARMUP_STEPS} warm-up steps")
    torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    precision = resolve_precision(args.precision)
    frozen = args.embeddings == "frozen"
    batches = sentence_batches(args.steps)
    flops = statistics.mean(step_flops(b) for b in batches[WARMUP_STEPS:])
    peak = matmul_flops_per_s(torch.bfloat16 if precision == "bf16-mixed" else torch.float32, 3.0)
    isa = os.environ.get("ATEN_CPU_CAPABILITY", "default")
    print(f"bert_tiny classifier, {len(batches)} batches of {BATCH_SIZE} sentences (mean {MEAN_LENGTH} tokens, grouped "
          f"by length), embeddings {args.embeddings}, {precision}, {args.threads} threads, ATEN_CPU_CAPABILITY={isa}; "
          f"{flops / 1e9:.2f} GFLOP a step; matmul peak {peak / 1e9:.0f} GFLOP/s (2048^2 torch.mm)", flush=True)
    seconds = {}
    for name in args.rows:
        seconds[name] = (two_processes_row(args.steps, precision, frozen) if name == "2 x 1 thread"
                         else ROWS[name](batches, precision, frozen))
        print(f"  {name}: {seconds[name] * 1e3:.1f} ms/step", flush=True)
    base = seconds.get("pipeline")
    print(f"\n{'row':<14} {'steps/s':>8} {'GFLOP/s':>8} {'of peak':>8} {'x pipeline':>11}   "
          f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    for name, s in seconds.items():
        ratio = f"{base / s:.2f}x" if base else "-"
        print(f"{name:<14} {1 / s:8.1f} {flops / s / 1e9:8.0f} {flops / s / peak:8.0%} {ratio:>11}")


if __name__ == "__main__":
    main()
