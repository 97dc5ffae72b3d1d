"""A zero-shot prompt probe: does a pretrain stage's masked-LM head rank sentiment words by a review sentence's
sentiment better than the same architecture randomly initialised? No training at all
(docs/history/pretraining_recipes_log.md, "Does the masked LM know what a review says?").

Prompt-based fine-tuning (PET, Schick & Schütze 2021; LM-BFF, Gao et al. 2021) adds no new head: it reads the
pretrained MLM head at a [MASK] in a template ("... it was [MASK] .") and compares label words ("great" against
"terrible"). It can only start ahead of a random model if that head already orders the label words by sentiment, which
is what this measures:
- each sentence of the selection split (the tenth of Rotten Tomatoes *train* that finetune.selection_fraction=0.1
  scores on, cut by the pipeline's own split_off; dev.tsv is never read) is put in four templates, [CLS] ... [SEP],
  at most 64 pieces, the sentence cut so that the template survives;
- every ordered pair (w1, w2) of label words that are one piece in the vocabulary scores a sentence by
  log p(w1) - log p(w2) at the mask, and predicts "positive" above that score's median over the split. The median
  calibrates away the words' prior (Zhao et al. 2021, "Calibrate Before Use"): half of the sentences are called
  positive whatever the pair, so a score unrelated to the labels scores 0.5 whatever the split's label balance;
- per template and encoder: the best ordered pair's accuracy (chosen on the same sentences it is scored on: an upper
  bound) and that of (good, bad).

    python benchmarks/prompt_probe.py --pretrain ~/.cache/textrep/stages/pretrain/<hash> \
        --tokenizer ~/.cache/textrep/stages/tokenizer/<hash> --task-dir ~/.cache/textrep/data/rotten_tomatoes

It prints a markdown table, the binomial chance spread of one pair's accuracy, and a JSON line with every figure.
A forward pass of ~1,100 x 4 short sequences per encoder: under 20 s on one core for a 2-layer model, imports
included (--threads 1).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_prep.corpus.tokenizer import MASK_ID, PAD_ID, UNK_ID, encode_batch_ids, load_tokenizer  # noqa: E402
from models.bert import BertForPreTraining, load_pretrained  # noqa: E402
from models.checkpoint import random_twin  # noqa: E402
from models.kernels import use_fast_kernels  # noqa: E402
from pipeline.bert.data import prompt_ids  # noqa: E402
from pipeline.bert.pretrain import HEADS_FILE  # noqa: E402
from pipeline.downstream.task_data import split_off  # noqa: E402
from pipeline.downstream.tasks import TaskSplit, load_task, read_split  # noqa: E402

TEMPLATES = ("{text} it was [MASK] .", "{text} it is [MASK] .", "a [MASK] film . {text}", "{text} a [MASK] film .")
CANDIDATES = ("good", "bad", "great", "terrible", "best", "worst", "fine", "poor", "love", "hate", "dull", "awful")
MAX_LENGTH = 64
SELECTION_FRACTION = 0.1  # the fraction the recipe runs select on (finetune.selection_fraction=0.1)
POSITIVE = 1  # tasks/rotten_tomatoes.yaml labels ["0", "1"]: 1 is fresh


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrain", required=True, help="a pretrain stage's directory (encoder/ and " + HEADS_FILE + ")")
    p.add_argument("--tokenizer", required=True, help="the tokenizer stage's directory it was trained with")
    p.add_argument("--task-dir", required=True, help="the Rotten Tomatoes directory with train.tsv")
    # finetune passes the run's top-level `seed` (default 12345) to split_off, not its per-run seeds
    p.add_argument("--seed", type=int, default=12345, help="the selection split's seed (the run's `seed`)")
    p.add_argument("--random-seed", type=int, default=1, help="torch seed of the randomly initialised twin")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def selection_split(task_dir: Path, seed: int, fraction: float = SELECTION_FRACTION) -> TaskSplit:
    """The held-out part of train that fine-tuning scores on with finetune.selection_fraction=`fraction`: the
    pipeline's split_off on train.tsv as tsv_splits reads it (which also reads dev.tsv: not called here)."""
    task = load_task("rotten_tomatoes")
    _, held_out = split_off(read_split(task, Path(task_dir) / task.train_file), fraction, seed)
    return held_out


def label_words(tokenizer, candidates=CANDIDATES) -> tuple[dict[str, int], list[str]]:
    """({word: id} of the candidates that are one piece of the vocabulary, [the others]): a word split into pieces
    has no single probability at one [MASK]."""
    kept, dropped = {}, []
    for word, ids in zip(candidates, encode_batch_ids(tokenizer, list(candidates))):
        if len(ids) == 1 and ids[0] != UNK_ID:
            kept[word] = ids[0]
        else:
            dropped.append(word)
    return kept, dropped


def load_pretraining_model(pretrain_dir: Path) -> BertForPreTraining:
    """The stage's encoder under its MLM and NSP heads, as a later pretraining phase continues from them."""
    encoder = load_pretrained(Path(pretrain_dir) / "encoder")
    model = use_fast_kernels(BertForPreTraining(encoder.config))  # as the pretraining stage builds it
    model.load_encoder_and_heads(encoder, load_file(str(Path(pretrain_dir) / HEADS_FILE)))
    return model.eval()


@torch.inference_mode()
def mask_log_probs(model: BertForPreTraining, sequences: list[list[int]], word_ids: list[int],
                   batch_size: int = 64) -> np.ndarray:
    """(sentences, words): log p(word) at each sequence's [MASK], softmax over the whole vocabulary."""
    out = []
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start:start + batch_size]
        input_ids = torch.full((len(batch), max(map(len, batch))), PAD_ID, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            attention_mask[row, :len(ids)] = 1
        positions = (input_ids == MASK_ID).long().argmax(1, keepdim=True)  # (B, 1): one [MASK] per sequence
        logits, _ = model(input_ids, attention_mask=attention_mask, mlm_positions=positions)  # (B, 1, V)
        out.append(torch.log_softmax(logits[:, 0].float(), -1)[:, word_ids].numpy())
    return np.concatenate(out)


def median_accuracy(score: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of calling a sentence positive when its score is above the score's median over the split."""
    return float(((score > np.median(score)) == (labels == POSITIVE)).mean())


def pair_accuracies(log_probs: np.ndarray, labels, words: list[str]) -> dict[tuple[str, str], float]:
    """{(w1, w2): median_accuracy of log p(w1) - log p(w2)} for every ordered pair of distinct words (columns of
    log_probs). Both orders are kept: reversed, a pair is about 1 - its accuracy, so the best is the best way round."""
    labels = np.asarray(labels)
    return {(words[i], words[j]): median_accuracy(log_probs[:, i] - log_probs[:, j], labels)
            for i, j in itertools.permutations(range(len(words)), 2)}


def best_pair(accuracies: dict[tuple[str, str], float]) -> tuple[tuple[str, str], float]:
    """The ordered pair of the highest accuracy (the first in the words' order on ties)."""
    pair = max(accuracies, key=accuracies.get)
    return pair, accuracies[pair]


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.tokenizer)
    split = selection_split(Path(a.task_dir), a.seed)
    labels = np.asarray(split.labels)
    words, dropped = label_words(tokenizer)
    names, word_ids = list(words), list(words.values())
    pretrained = load_pretraining_model(Path(a.pretrain))
    # models.checkpoint.random_twin draws the evaluate stage's bert_*_random: the class and config under
    # torch.manual_seed. The fine-tune stage's random_init has no MLM head (a classifier built under seed_everything);
    # at the same seed its encoder is this twin's but for the word embeddings, which the tied MLM decoder redraws.
    twin = use_fast_kernels(random_twin(pretrained, a.random_seed))  # as the evaluate stage builds it
    encoders = {"pretrained": pretrained, "random init": twin.eval()}
    sequences = {template: prompt_ids(tokenizer, template, split.texts_a, MAX_LENGTH) for template in TEMPLATES}

    results = {}
    for name, model in encoders.items():
        results[name] = {}
        for template, seqs in sequences.items():
            accuracies = pair_accuracies(mask_log_probs(model, seqs, word_ids, a.batch_size), labels, names)
            pair, accuracy = best_pair(accuracies)
            results[name][template] = {
                "best_pair": list(pair), "best_accuracy": round(accuracy, 4),
                "good_bad": round(accuracies[("good", "bad")], 4) if {"good", "bad"} <= set(words) else None,
                # every ordered pair: row w1, column w2, in label_words' order (None on the diagonal)
                "pair_accuracy": [[None if i == j else round(accuracies[(w1, w2)], 4) for j, w2 in enumerate(names)]
                                  for i, w1 in enumerate(names)]}

    n = len(labels)
    chance_std = math.sqrt(0.25 / n)
    print(f"selection split: {n} sentences of {Path(a.task_dir) / 'train.tsv'} (seed {a.seed}), "
          f"{int((labels == POSITIVE).sum())} positive")
    print(f"label words ({len(names)}, {len(names) * (len(names) - 1)} ordered pairs): {', '.join(names)}; "
          f"dropped (not one piece): {', '.join(dropped) or 'none'}")
    print(f"chance spread of one pair's accuracy: +-{chance_std:.4f} (binomial std at p=0.5, n={n})\n")
    print("| encoder | template | best ordered pair | its accuracy | good vs bad |")
    print("|---|---|---|---|---|")
    for name, by_template in results.items():
        for template, r in by_template.items():
            good_bad = "-" if r["good_bad"] is None else f"{r['good_bad']:.3f}"
            print(f"| {name} | `{template}` | {r['best_pair'][0]} vs {r['best_pair'][1]} | {r['best_accuracy']:.3f} "
                  f"| {good_bad} |")
    summary = {"pretrain": str(a.pretrain), "tokenizer": str(a.tokenizer), "task_dir": str(a.task_dir),
               "seed": a.seed, "random_seed": a.random_seed, "selection_fraction": SELECTION_FRACTION,
               "max_length": MAX_LENGTH, "sentences": n, "positive": int((labels == POSITIVE).sum()),
               "chance_std": round(chance_std, 4), "label_words": names, "dropped": dropped, "results": results}
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
