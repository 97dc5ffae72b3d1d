"""One pretraining ablation of docs/pretraining_recipes.md: BERT masked LM (+ NSP) on an examples stage's Arrow files
with the pipeline's own model, collator, loss and optimizer, in a plain loop, printing the held-out MLM loss, MLM and
NSP accuracy and the elapsed time five times and a JSON line at the end.

    python benchmarks/pretrain_ablation.py --examples ~/.cache/textrep/stages/examples/<hash> \
        --tokenizer ~/.cache/textrep/stages/tokenizer/<hash> --pos relative --preln 1 --lr 2e-3 --dropout 0

The held-out set is the pipeline's (the first 550 instances of the seed-12345 permutation, masked once); rows longer
than --seqlen are cut, so shorter sequences see the same text. Run two at a time with --threads 1 on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_prep.corpus.tokenizer import MASK_ID, PAD_ID, SPECIAL_TOKENS, load_tokenizer  # noqa: E402
from models.bert import BertForPreTraining, bert_config  # noqa: E402
from models.kernels import use_fast_kernels  # noqa: E402
from pipeline.bert.data import BertPretrainingCollator, PretrainingInstances  # noqa: E402
from pipeline.bert.module import bert_pretraining_losses  # noqa: E402
from pipeline.engine.arrow import read_arrow  # noqa: E402
from pipeline.engine.optim import LR_DECAYS, adamw_with_schedule  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", required=True, help="an examples stage's directory (examples-*.arrow)")
    p.add_argument("--tokenizer", required=True, help="the tokenizer stage's directory it was built with")
    p.add_argument("--size", default="bert_tiny")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int, help="hidden size; the feed-forward is 4x")
    p.add_argument("--heads", type=int)
    p.add_argument("--pos", default="learned", choices=["learned", "sinusoidal", "relative"])
    p.add_argument("--preln", type=int, default=0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--sched", default="linear", choices=list(LR_DECAYS))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--seqlen", type=int, default=128)
    p.add_argument("--mlm", type=float, default=0.15, help="masking rate")
    p.add_argument("--maxpred", type=int, default=20, help="max predictions per sequence")
    p.add_argument("--nsp", type=int, default=1, help="1: MLM + NSP loss, 0: MLM alone")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tag", default="")
    return p.parse_args()


def main() -> None:
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    vocab = load_tokenizer(a.tokenizer).get_vocab_size()
    data = PretrainingInstances([read_arrow(p) for p in sorted(Path(a.examples).glob("*.arrow"))])
    order = np.random.default_rng(12345).permutation(len(data))
    held_out, train = order[:550], order[550:]

    def row(i: int) -> dict:
        r = data[int(i)]
        return {**r, "input_ids": r["input_ids"][:a.seqlen], "token_type_ids": r["token_type_ids"][:a.seqlen]}

    def collator(rate: float, predictions: int, seed: int) -> BertPretrainingCollator:
        return BertPretrainingCollator(pad_id=PAD_ID, mask_id=MASK_ID, vocab_size=vocab,
                                       special_ids=range(len(SPECIAL_TOKENS)), mlm_probability=rate,
                                       max_predictions_per_seq=predictions,
                                       generator=torch.Generator().manual_seed(seed))

    train_collator, held_out_collator = collator(a.mlm, a.maxpred, 1), collator(0.15, 20, 2)
    held_out_rows = [data[int(i)] for i in held_out]
    held_out_batches = [held_out_collator(held_out_rows[i:i + 64]) for i in range(0, len(held_out_rows), 64)]
    shape = {k: v for k, v in dict(num_hidden_layers=a.layers, hidden_size=a.hidden,
                                   num_attention_heads=a.heads).items() if v}
    if a.hidden:
        shape["intermediate_size"] = 4 * a.hidden
    model = BertForPreTraining(bert_config(a.size, vocab_size=-(-vocab // 64) * 64, max_position_embeddings=128,
                                           pre_layer_norm=bool(a.preln), hidden_dropout_prob=a.dropout,
                                           attention_probs_dropout_prob=a.dropout, position_embedding_type=a.pos,
                                           **shape))
    use_fast_kernels(model)  # as the pipeline builds it (trainer.fast_kernels)
    optimization = adamw_with_schedule(model, a.lr, 0.01, (0.9, 0.999), a.warmup, a.steps, decay=a.sched)
    optimizer, schedule = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]

    @torch.no_grad()
    def evaluate() -> list[float]:
        model.eval()
        outs = [bert_pretraining_losses(model, b) for b in held_out_batches]
        model.train()
        return [round(float(torch.stack([o[k] for o in outs]).mean()), 3)
                for k in ("mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")]

    rng, position = np.random.default_rng(0), 0
    permutation = rng.permutation(train)
    started, history = time.perf_counter(), []
    for step in range(1, a.steps + 1):
        if position + a.bs > len(permutation):
            permutation, position = rng.permutation(train), 0
        batch = train_collator([row(i) for i in permutation[position:position + a.bs]])
        position += a.bs
        loss = bert_pretraining_losses(model, batch, next_sentence_prediction=bool(a.nsp))["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % max(1, a.steps // 5) == 0 or step == a.steps:
            history.append((step, round(time.perf_counter() - started, 1), *evaluate()))
            print(a.tag, "step, seconds, held-out mlm loss, nsp loss, mlm acc, nsp acc:", history[-1], flush=True)
    print(json.dumps({"tag": a.tag, "args": vars(a), "final": history[-1]}), flush=True)


if __name__ == "__main__":
    main()
