"""The pretrained encoder-decoder's encoder as a frozen sentence encoder for the evaluate stage, and its randomly
initialised twin."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from models.checkpoint import random_twin
from models.kernels import use_fast_kernels
from models.seq2seq import pad_sources
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.engine.settings import typed_settings
from pipeline.engine.training import TrainerConfig
from pipeline.seq2seq.architectures import load_model


class Seq2SeqMeanEncoder:
    """SentEval encoder: the mean of the encoder's final states over a sentence's tokens (bidirectional attention:
    every state has read the whole sentence: the Transformer's self-attention, the RNN's two directions), the memory
    the decoder attends to."""

    def __init__(self, model_dir: Path, name: str, random_init_seed: int | None = None, fast_kernels: bool = True):
        self.name = name
        model = load_model(model_dir)
        model = model if random_init_seed is None else random_twin(model, random_init_seed)
        self.model = (use_fast_kernels(model) if fast_kernels else model).eval()  # trainer.fast_kernels
        self.tokenizer = load_seq2seq_tokenizer(model_dir)

    def prepare(self, samples: list[list[str]]) -> None:
        pass

    @torch.no_grad()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        config = self.model.config
        ids = [[*e.ids[: config.max_positions - 1], config.eos_token_id]  # an empty sentence is its end token
               for e in self.tokenizer.encode_batch([" ".join(tokens) for tokens in batch])]
        input_ids, attention_mask = pad_sources(ids, config.pad_token_id)
        states = self.model.encoder_states(input_ids, attention_mask)  # (B, S, d)
        mask = attention_mask[..., None].float()
        return ((states * mask).sum(1) / mask.sum(1)).numpy()


def seq2seq_encoder(random_init: bool):
    def build(ctx: StageContext) -> Seq2SeqMeanEncoder:
        return Seq2SeqMeanEncoder(ctx.stage_dir("seq2seq_pretrain") / "model",
                                  name="seq2seq_mean_random" if random_init else "seq2seq_mean",
                                  random_init_seed=ctx.cfg.seed if random_init else None,
                                  fast_kernels=typed_settings(ctx.cfg.trainer, TrainerConfig).fast_kernels)
    return build


ENCODERS = {name: EncoderSpec(lambda cfg: ("seq2seq_pretrain",), seq2seq_encoder(random_init),
                              random_twin=None if random_init else "seq2seq_mean_random")
            for name, random_init in (("seq2seq_mean", False), ("seq2seq_mean_random", True))}
