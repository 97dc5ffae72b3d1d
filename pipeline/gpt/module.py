"""GPT pretraining (Radford et al. 2018; GPT-2): the causal-LM objective over packed blocks, and their collation."""
from __future__ import annotations

import math

import numpy as np
import torch

from data_prep.examples.gpt_blocks import BLOCK_SCHEMA
from models.gpt import GPTLMHeadModel
from pipeline.engine.module import OptimizerSettings, PretrainModule

(BLOCK_COLUMN,) = BLOCK_SCHEMA.names  # rows of block_size + 1 token ids


def collate_blocks(rows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Inputs are a block's first block_size tokens, targets its last block_size (the next token at each position)."""
    ids = torch.from_numpy(np.stack([row[BLOCK_COLUMN] for row in rows]))
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:]}


class GPTPretrainModule(PretrainModule):
    """Next-token cross-entropy over every position of a block. `val/loss` is the held-out NLL per token over the
    whole held-out set and `val/perplexity` its exp, the number GPT-2 reports."""

    def __init__(self, model: GPTLMHeadModel, optimizer: OptimizerSettings):
        super().__init__(model, optimizer)
        self._val_totals = torch.zeros(2, dtype=torch.float64)  # NLL sum, tokens
        self.heldout_perplexity: float | None = None

    def model_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": self.model(batch["input_ids"], batch["targets"]).loss}

    def on_validation_epoch_start(self) -> None:
        self._val_totals.zero_()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss = self.model_step(batch)["loss"]  # eval mode: never label-smoothed
        tokens = batch["targets"].numel()
        self._val_totals += torch.tensor([loss.item() * tokens, tokens], dtype=torch.float64)

    def on_validation_epoch_end(self) -> None:
        nll, tokens = self._val_totals.tolist()
        if tokens == 0:
            return
        self.heldout_perplexity = math.exp(nll / tokens)
        self.log("val/loss", nll / tokens)
        self.log("val/perplexity", self.heldout_perplexity, prog_bar=True)
