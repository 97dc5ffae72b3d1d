"""Encoder-decoder pretraining (seed 000's training loop on the shared harness): the label-smoothed loss of the target
given the corrupted source (data_prep/examples/seq2seq_examples.py), and the pairs' collation."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from data_prep.examples.seq2seq_examples import EXAMPLE_SCHEMA
from models import IGNORE_INDEX
from models.seq2seq import shift_right
from pipeline.engine.module import PretrainModule

SOURCE_COLUMN, TARGET_COLUMN = EXAMPLE_SCHEMA.names


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-padded (B, T) int64 ids."""
    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(np.asarray(row, dtype=np.int64))
    return out


def collate_pairs(rows: list[dict], pad_token_id: int, decoder_start_token_id: int) -> dict[str, torch.Tensor]:
    """Rows {source, target} -> input_ids and attention_mask (B, S) (sources right-padded), targets (B, T) (padding
    IGNORE_INDEX: not scored) and decoder_input_ids (B, T): the targets after the start token (teacher forcing)."""
    sources = [row[SOURCE_COLUMN] for row in rows]
    input_ids = pad_rows(sources, pad_token_id)
    attention_mask = (torch.arange(input_ids.size(1))[None, :] < torch.tensor([len(s) for s in sources])[:, None])
    targets = pad_rows([row[TARGET_COLUMN] for row in rows], IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask.long(), "targets": targets,
            "decoder_input_ids": shift_right(targets, decoder_start_token_id, pad_token_id)}


class PairCollator:
    """collate_pairs for one model's ids: a picklable callable (loader workers)."""

    def __init__(self, pad_token_id: int, decoder_start_token_id: int):
        self.pad_token_id, self.decoder_start_token_id = pad_token_id, decoder_start_token_id

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return collate_pairs(rows, self.pad_token_id, self.decoder_start_token_id)


class Seq2SeqPretrainModule(PretrainModule):
    """The target's loss given the source: label-smoothed in training (the model's LabelSmoothing, seed 000's
    criterion), plain cross-entropy in eval mode, so `val/loss` is the held-out NLL per target token."""

    def model_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": self.model(batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"],
                                   batch["targets"]).loss}
