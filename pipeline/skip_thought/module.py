"""Skip-Thought pretraining (Kiros et al. 2015): the LightningModule and the collation of its triples.

How the stages use this module (pipeline/skip_thought/data_stages.py, then pretrain.py):

1. vocabulary: `count_words` over every sentence shard (one Ray task per shard, counters added up as they come), then
   `build_word_vocab(counts, skip_thought.vocab_size).save(<stage>/vocab.txt)`.
2. examples: per shard, `write_triples(triples_from_shard(read_arrow(shard), vocab, max_words), out)`
   (one Ray task per shard; shards hold whole books in order, so triples never span two books).
3. pretrain, on the pretraining harness (pipeline/engine/pretraining.py): `SkipThoughtPretrainModule(model,
   optimizer settings)`, or `QuickThoughtPretrainModule` (skip_thought.objective), with the model from the Hydra `model`
   config (`config.vocab_size = len(vocab)`), the engine's
   loaders (pipeline/engine/loaders.py) over the examples' Arrow files collated by `collate_triples`, then
   `models.skip_thought.save_pretrained(model, <stage>/model)` and vocab.txt copied next to it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from data_prep.examples.skip_thought_examples import EOS_ID, PAD_ID
from pipeline.engine.module import PretrainModule


def pad_sentences(sentences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word-id sentences -> right-padded ids (B, T) with <eos> appended, and lengths (B,) counting the <eos>.

    The encoder reads the <eos> and each decoder learns to predict it, as in the authors' code. Use this for any
    sentence given to SkipThoughts.encode, not only for training batches."""
    lengths = torch.tensor([len(s) + 1 for s in sentences], dtype=torch.long)
    ids = torch.full((len(sentences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = torch.as_tensor(np.asarray(sentence, dtype=np.int64))
        ids[row, len(sentence)] = EOS_ID
    return ids, lengths


def collate_triples(rows: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
    """Rows with `previous`, `current`, `next` word ids -> the keyword arguments of SkipThoughts.forward:
    ids/lengths (current sentence), previous_ids/previous_lengths, next_ids/next_lengths; each sentence padded
    separately, to its own longest length."""
    ids, lengths = pad_sentences([r["current"] for r in rows])
    previous_ids, previous_lengths = pad_sentences([r["previous"] for r in rows])
    next_ids, next_lengths = pad_sentences([r["next"] for r in rows])
    return {"ids": ids, "lengths": lengths, "previous_ids": previous_ids, "previous_lengths": previous_lengths,
            "next_ids": next_ids, "next_lengths": next_lengths}


class SkipThoughtPretrainModule(PretrainModule):
    """The sum of the previous- and next-sentence decoders' cross-entropies (Kiros et al. eq. 9), per target word, of
    a `models.skip_thought.SkipThoughts`."""

    def model_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model(**batch)
        metrics = {}
        for name, decoded in (("previous", out.previous), ("next", out.next)):
            metrics[f"{name}_loss"] = F.cross_entropy(decoded.logits.float(), decoded.targets)
            metrics[f"{name}_acc"] = (decoded.logits.argmax(-1) == decoded.targets).float().mean()
        metrics["loss"] = metrics["previous_loss"] + metrics["next_loss"]
        return metrics


class QuickThoughtPretrainModule(PretrainModule):
    """Quick-Thoughts' loss (Logeswaran & Lee 2018, eq. 2) of a `models.skip_thought.QuickThoughts`: each sentence's
    two true neighbours, its previous and its next sentence, classified among the batch's 2B candidates under one
    softmax over the inner products, -log p(previous) - log p(next) averaged over the batch. `context_acc`: the share
    of sentences whose best-scored candidate is one of their own neighbours."""

    def model_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scores = self.model(**batch).float()  # (B, 2B): candidates previous_1..previous_B, next_1..next_B
        B = scores.shape[0]
        rows = torch.arange(B, device=scores.device)
        log_probs = scores.log_softmax(dim=-1)
        loss = -(log_probs[rows, rows] + log_probs[rows, B + rows]).mean()
        best = scores.argmax(dim=-1)
        return {"loss": loss, "context_acc": ((best == rows) | (best == B + rows)).float().mean()}
