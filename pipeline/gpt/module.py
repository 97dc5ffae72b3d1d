"""GPT pretraining (Radford et al. 2018; GPT-2): the causal-LM LightningModule and the loaders over packed blocks."""
from __future__ import annotations

import math

import lightning as L
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from models.gpt import GPTLMHeadModel
from pipeline.engine.arrow import list_column
from pipeline.engine.sampler import ResumableRandomSampler, SeededBatchSampler, held_out_count
from pipeline.optim import adamw_with_schedule


class Blocks(Dataset):
    """Rows of block_size + 1 token ids from the Arrow files of data_prep.gpt_blocks, sliced from the memory map."""

    def __init__(self, tables: list[pa.Table]):
        self.parts = [list_column(t, "ids") for t in tables if t.num_rows]
        self.cumulative = np.cumsum([len(offsets) - 1 for offsets, _ in self.parts])

    def __len__(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    def __getitem__(self, index: int) -> np.ndarray:
        part = int(np.searchsorted(self.cumulative, index, side="right"))
        row = index - (int(self.cumulative[part - 1]) if part else 0)
        offsets, values = self.parts[part]
        return values[offsets[row]: offsets[row + 1]].astype(np.int64)  # a copy: not aliasing the read-only map


def collate_blocks(blocks: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Inputs are a block's first block_size tokens, targets its last block_size (the next token at each position)."""
    ids = torch.from_numpy(np.stack(blocks))
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:]}


class BlockBatches(Dataset):
    """Collated batches keyed by SeededBatchSampler's `(seed, indices)`; causal LM needs no augmentation, so the seed
    goes unused."""

    def __init__(self, blocks: Dataset):
        self.blocks = blocks

    def __getitem__(self, key: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
        _, indices = key
        return collate_blocks([self.blocks[i] for i in indices])


def block_loaders(blocks: Blocks, batch_size: int, val_fraction: float, val_max_blocks: int, seed: int,
                  num_workers: int = 0, rank: int = 0, world_size: int = 1) -> tuple[DataLoader, DataLoader]:
    """Training batches of rank `rank` in a resumable seeded order (the loader's sampler is a SeededBatchSampler) and
    the held-out blocks: a seeded random `val_fraction` of them, at most `val_max_blocks`, the same on every rank."""
    if len(blocks) < 2:
        raise ValueError(f"only {len(blocks)} GPT blocks: the corpus is shorter than two blocks; use a larger corpus "
                         "or lower gpt.block_size")
    order = np.random.default_rng(seed).permutation(len(blocks))
    n_val = held_out_count(len(blocks), val_fraction, val_max_blocks)
    batches = SeededBatchSampler(ResumableRandomSampler(len(blocks) - n_val, seed, world_size, rank), batch_size)
    # Generators of their own: creating a loader iterator would otherwise draw from the global RNG (dropout's).
    train = DataLoader(BlockBatches(Subset(blocks, order[n_val:])), sampler=batches, batch_size=None,
                       num_workers=num_workers, generator=torch.Generator().manual_seed(seed))
    val = DataLoader(Subset(blocks, sorted(order[:n_val].tolist())), batch_size=batch_size, collate_fn=collate_blocks,
                     generator=torch.Generator().manual_seed(seed))
    return train, val


class GPTPretrainModule(L.LightningModule):
    """Next-token cross-entropy over every position of a block. `val/loss` is the held-out NLL per token over the
    whole held-out set and `val/perplexity` its exp, the number GPT-2 reports."""

    def __init__(self, model: GPTLMHeadModel, lr: float, weight_decay: float, betas, warmup_steps: int,
                 max_steps: int, lr_decay: str = "linear"):
        super().__init__()
        self.model = model
        self.save_hyperparameters(ignore=["model"])
        self._val_totals = torch.zeros(2, dtype=torch.float64)  # NLL sum, tokens
        self.heldout_perplexity: float | None = None

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss, for the DeepSpeed loop (pipeline/engine/pretraining.py), which trains through forward."""
        return {"loss": self.model(batch["input_ids"], batch["targets"]).loss}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self(batch)["loss"]
        if not torch.isfinite(loss):
            raise FloatingPointError(f"GPT loss is {loss.item()} at step {self.global_step}; "
                                     "lower pretrain.lr or raise pretrain.warmup_steps")
        self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_totals.zero_()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss = self(batch)["loss"]  # eval mode: never label-smoothed
        tokens = batch["targets"].numel()
        self._val_totals += torch.tensor([loss.item() * tokens, tokens], dtype=torch.float64)

    def on_validation_epoch_end(self) -> None:
        nll, tokens = self._val_totals.tolist()
        if tokens == 0:
            return
        self.heldout_perplexity = math.exp(nll / tokens)
        self.log("val/loss", nll / tokens)
        self.log("val/perplexity", self.heldout_perplexity, prog_bar=True)

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_with_schedule(self.model, hp.lr, hp.weight_decay, hp.betas, hp.warmup_steps, hp.max_steps,
                                   decay=hp.lr_decay)
