"""Did pretraining learn anything? The masked-LM loss a model reaches by knowing token frequencies alone, and the
plain-words verdict when a run's held-out loss has not got clearly below it.

A model that predicts every masked token from the corpus's unigram distribution, ignoring the context, scores the
cross-entropy of the held-out targets under that distribution. Small BERTs reach it within a few hundred steps and
can sit there for thousands more (the "unigram plateau"): the loss looks like it fell a long way from log V, yet the
encoder has learned token frequencies and nothing about context, and fine-tunes no better than random weights."""
from __future__ import annotations

import numpy as np

# Held-out MLM loss this close to the unigram baseline (nats) counts as not having left the plateau: half a nat
# of context is what a bag-of-words guess at the topic gives (6.30 against 6.81 fine-tuned no better
# than random init).
PLATEAU_MARGIN_NATS = 0.3


def unigram_cross_entropy(counts: np.ndarray, targets: np.ndarray) -> float:
    """Mean -log p(target) in nats, with p the add-one smoothed unigram distribution of `counts` (one count per
    token id; ids that can never be a target, such as special tokens, should have been zeroed by the caller and
    get no smoothing mass). Add-one keeps a held-out target never seen in training finite."""
    counts = np.asarray(counts, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.size == 0:
        raise ValueError("no held-out targets to score the unigram baseline on")
    possible = counts > 0
    possible[targets] = True  # a target id never seen in training still gets its add-one share
    smoothed = np.where(possible, counts + 1.0, 0.0)
    log_p = np.log(smoothed[targets]) - np.log(smoothed.sum())
    return float(-log_p.mean())


def plateau_message(held_out_mlm_loss: float | None, unigram_loss: float | None,
                    margin: float = PLATEAU_MARGIN_NATS) -> str | None:
    """A warning in plain words when the held-out MLM loss is within `margin` nats of the unigram baseline (or
    above it); None when pretraining has clearly learned more than token frequencies or either figure is missing."""
    if held_out_mlm_loss is None or unigram_loss is None:
        return None
    gap = unigram_loss - held_out_mlm_loss
    if gap >= margin:
        return None
    where = f"only {gap:.2f} nats below" if gap >= 0 else f"{-gap:.2f} nats above"
    return (f"pretraining has not left the unigram plateau: held-out MLM loss {held_out_mlm_loss:.3f} is {where} "
            f"the {unigram_loss:.3f} a model knowing only token frequencies reaches, so the "
            f"encoder has learned little about context and will fine-tune about as well as random weights. Try more "
            f"steps (pretrain.max_steps), a higher pretrain.lr with model.config.pre_layer_norm=true, or the recipes "
            f"in docs/pretraining_recipes.md")
