"""Skip-Thought pretraining (Kiros et al. 2015): the LightningModule and the data helpers a pipeline stage needs.

How the stages use this module (pipeline/skip_thought/data_stages.py, then stages.py):

1. vocabulary: `count_words` over every sentence shard (one Ray task per shard, counters added up as they come), then
   `build_word_vocab(counts, cfg.skip_thought.vocab_size).save(<stage>/vocab.txt)`.
2. examples: per shard, `write_triples(triples_from_shard(read_arrow(shard), vocab, max_words), out)`
   (one Ray task per shard; shards hold whole books in order, so triples never span two books).
3. pretrain, on the pretraining harness (pipeline/engine/pretraining.py): `SkipThoughtPretrainModule(model, lr,
   weight_decay, betas, warmup_steps, max_steps)` with the model from the Hydra `model` config
   (`config.vocab_size = len(vocab)`), the loaders of `triple_loaders(SkipThoughtTriples(tables), batch_size,
   val_fraction, val_max_triples, seed, rank=, world_size=)` over the examples' Arrow files, then
   `models.skip_thought.save_pretrained(model, <stage>/model)` and vocab.txt copied next to it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import lightning as L
import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

from data_prep.skip_thought_examples import EOS_ID, PAD_ID, TRIPLE_SCHEMA
from models.skip_thought import SkipThoughts
from pipeline.engine.arrow import list_column
from pipeline.engine.sampler import ResumableRandomSampler, SeededBatchSampler, held_out_count
from pipeline.engine.training import log_step_outputs
from pipeline.optim import adamw_with_schedule


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


class SkipThoughtTriples(Dataset):
    """(previous, current, next) word-id triples from Arrow files written by data_prep.skip_thought_examples.

    Rows are sliced out of the memory-mapped files on demand, so RAM does not grow with the corpus."""

    def __init__(self, tables: list[pa.Table]):
        tables = [t for t in tables if t.num_rows]
        self.parts = [[list_column(t, name) for name in TRIPLE_SCHEMA.names] for t in tables]
        self.cumulative = np.cumsum([t.num_rows for t in tables])

    def __len__(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    def word_total(self) -> int:
        """The words of all triples' sentences."""
        return sum(len(values) for part in self.parts for _, values in part)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        part = int(np.searchsorted(self.cumulative, index, side="right"))
        row = index - (int(self.cumulative[part - 1]) if part else 0)
        # Copies: tensors must not alias the read-only memory map.
        return {name: values[offsets[row]: offsets[row + 1]].astype(np.int64)
                for name, (offsets, values) in zip(TRIPLE_SCHEMA.names, self.parts[part])}


class TripleBatches(Dataset):
    """Collated batches keyed by SeededBatchSampler's `(seed, indices)`; triples need no random augmentation, so the
    seed goes unused."""

    def __init__(self, triples: Dataset):
        self.triples = triples

    def __getitem__(self, key: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
        _, indices = key
        return collate_triples([self.triples[i] for i in indices])


def triple_loaders(dataset: SkipThoughtTriples, batch_size: int, val_fraction: float, val_max_triples: int, seed: int,
                   num_workers: int = 0, rank: int = 0, world_size: int = 1) -> tuple[DataLoader, DataLoader]:
    """Training batches of rank `rank` of `world_size`, in a resumable seeded order (the loader's `sampler` is a
    SeededBatchSampler, whose state a checkpoint keeps), and fixed held-out batches (a seeded random `val_fraction`
    of the triples, at most `val_max_triples`: 2 % of BookCorpus's 74 M sentences would be 1.5 M triples scored at
    every validation)."""
    if len(dataset) < 2:
        raise ValueError(f"only {len(dataset)} Skip-Thought triples; a book needs at least 3 sentences to give one. "
                         "Use a larger corpus or lower data.min_tokens")
    order = np.random.default_rng(seed).permutation(len(dataset))
    n_val = held_out_count(len(dataset), val_fraction, val_max_triples)
    batches = SeededBatchSampler(ResumableRandomSampler(len(dataset) - n_val, seed, world_size, rank), batch_size)
    # Generators of their own: creating a loader iterator would otherwise draw from the global RNG (dropout's).
    train = DataLoader(TripleBatches(Subset(dataset, order[n_val:])), sampler=batches, batch_size=None,
                       num_workers=num_workers, generator=torch.Generator().manual_seed(seed))
    val = DataLoader(Subset(dataset, sorted(order[:n_val].tolist())), batch_size=batch_size,
                     collate_fn=collate_triples, generator=torch.Generator().manual_seed(seed))
    return train, val


class SkipThoughtPretrainModule(L.LightningModule):
    """Sum of the previous- and next-sentence decoders' cross-entropies (Kiros et al. eq. 9), per target word."""

    def __init__(self, model: SkipThoughts, lr: float, weight_decay: float, betas, warmup_steps: int, max_steps: int,
                 lr_decay: str = "linear"):
        super().__init__()
        self.model = model
        self.save_hyperparameters(ignore=["model"])

    def model_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model(**batch)
        metrics = {}
        for name, decoded in (("previous", out.previous), ("next", out.next)):
            metrics[f"{name}_loss"] = F.cross_entropy(decoded.logits.float(), decoded.targets)
            metrics[f"{name}_acc"] = (decoded.logits.argmax(-1) == decoded.targets).float().mean()
        metrics["loss"] = metrics["previous_loss"] + metrics["next_loss"]
        return metrics

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The losses, for the DeepSpeed loop (pipeline/engine/pretraining.py), which trains through forward."""
        return self.model_step(batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model_step(batch)
        if not torch.isfinite(out["loss"]):
            raise FloatingPointError(f"Skip-Thought loss is {out['loss'].item()} at step {self.global_step}; "
                                     "lower pretrain.lr or set pretrain.grad_clip")
        log_step_outputs(self, "train", out, batch["ids"].shape[0])
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        log_step_outputs(self, "val", self.model_step(batch), batch["ids"].shape[0])

    def test_step(self, batch: dict, batch_idx: int) -> None:
        log_step_outputs(self, "test", self.model_step(batch), batch["ids"].shape[0])

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_with_schedule(self.model, hp.lr, hp.weight_decay, hp.betas, hp.warmup_steps, hp.max_steps,
                                   decay=hp.lr_decay)
