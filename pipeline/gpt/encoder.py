"""The pretrained GPT as a frozen sentence encoder for the evaluate stage, and its randomly initialised twin."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data_prep.examples.gpt_blocks import load_gpt_tokenizer
from models.checkpoint import random_twin
from models.gpt import load_pretrained
from models.kernels import use_fast_kernels
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.engine.settings import typed_settings
from pipeline.engine.training import TrainerConfig


class GPTMeanEncoder:
    """SentEval encoder: the mean of the final states (after ln_f) over a sentence's tokens. Causal attention makes
    each state a summary of its prefix only, so the mean (rather than the last state, which GPT-1 fine-tunes a head
    on) is the frozen probe that does not favour the sentence's end."""

    def __init__(self, model_dir: Path, name: str, random_init_seed: int | None = None, fast_kernels: bool = True):
        self.name = name
        model = load_pretrained(model_dir)
        model = model if random_init_seed is None else random_twin(model, random_init_seed)
        self.model = (use_fast_kernels(model) if fast_kernels else model).eval()  # trainer.fast_kernels
        self.tokenizer = load_gpt_tokenizer(model_dir)

    def prepare(self, samples: list[list[str]]) -> None:
        pass

    @torch.no_grad()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        limit = self.model.config.n_positions
        ids = [e.ids[:limit] or [self.model.config.eos_token_id]  # an empty sentence reads as the end of text
               for e in self.tokenizer.encode_batch([" ".join(tokens) for tokens in batch])]
        T = max(len(i) for i in ids)
        idx = torch.zeros(len(ids), T, dtype=torch.long)
        mask = torch.zeros(len(ids), T)
        for row, seq in enumerate(ids):  # right padding: causal attention keeps real tokens from seeing it
            idx[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        states = self.model.transformer(idx)  # (B, T, C)
        return ((states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).numpy()


def gpt_encoder(random_init: bool):
    def build(ctx: StageContext) -> GPTMeanEncoder:
        return GPTMeanEncoder(ctx.stage_dir("gpt_pretrain") / "model",
                              name="gpt_mean_random" if random_init else "gpt_mean",
                              random_init_seed=ctx.cfg.seed if random_init else None,
                              fast_kernels=typed_settings(ctx.cfg.trainer, TrainerConfig).fast_kernels)
    return build


ENCODERS = {name: EncoderSpec(lambda cfg: ("gpt_pretrain",), gpt_encoder(random_init),
                              random_twin=None if random_init else "gpt_mean_random")
            for name, random_init in (("gpt_mean", False), ("gpt_mean_random", True))}
