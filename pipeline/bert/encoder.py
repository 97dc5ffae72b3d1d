"""A frozen BERT encoder as a sentence encoder for the evaluate stage (SentEval's prepare/batcher interface)."""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from data_prep.corpus.tokenizer import CLS_TOKEN, PAD_TOKEN, SEP_TOKEN, encode_batch_ids
from pipeline.bert.pretrain import encoder_stage
from pipeline.bert.settings import BERT_POOLINGS
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.engine.settings import typed_settings
from pipeline.engine.training import TrainerConfig


class BertEncoder:
    """Frozen BERT features: the final hidden state of [CLS] ("cls"; not the pooler, whose tanh layer was trained
    for next sentence prediction only) or the mean of the final hidden states over the real tokens, [CLS] and [SEP]
    included ("mean", as Sentence-BERT, Reimers & Gurevych 2019). Input is [CLS] sentence [SEP], cut to
    max_seq_length pieces (default: the model's max_position_embeddings)."""

    def __init__(self, model, tokenizer, pooling: str = "cls", max_seq_length: int | None = None,
                 name: str | None = None):
        if pooling not in BERT_POOLINGS:
            raise ValueError(f"pooling must be one of {BERT_POOLINGS}, got {pooling!r}")
        max_seq_length = max_seq_length or model.config.max_position_embeddings
        if not 2 < max_seq_length <= model.config.max_position_embeddings:
            raise ValueError(f"max_seq_length must be in 3..{model.config.max_position_embeddings} (the model's "
                             f"max_position_embeddings), got {max_seq_length}")
        self.model = model.eval()  # dropout off: the same sentence must get the same vector in any batch
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_seq_length = max_seq_length
        self.name = name or f"bert_{pooling}"

    @classmethod
    def from_directories(cls, encoder_dir, tokenizer_dir, random_init_seed: int | None = None,
                         fast_kernels: bool = True, **kwargs) -> "BertEncoder":
        """From a bert_pretrain stage's encoder/ (or a HuggingFace BERT directory) and a bert_tokenizer stage's
        directory; with `random_init_seed`, its architecture freshly initialised instead of its weights; with
        models/kernels.py's modules where `fast_kernels` (trainer.fast_kernels)."""
        from data_prep.corpus.tokenizer import load_tokenizer
        from models.checkpoint import random_twin
        from models.hf.bert import load_ours_or_hf
        from models.kernels import use_fast_kernels

        model = load_ours_or_hf(encoder_dir)
        if random_init_seed is not None:
            model = random_twin(model, random_init_seed)
        if fast_kernels:
            use_fast_kernels(model)
        return cls(model, load_tokenizer(tokenizer_dir), **kwargs)

    def prepare(self, samples: list[list[str]]) -> None:
        """Nothing to fit: the encoder is frozen and its vocabulary fixed."""

    @torch.inference_mode()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        pieces = encode_batch_ids(self.tokenizer, [" ".join(sentence) for sentence in batch])
        cls, sep, pad = (self.tokenizer.token_to_id(t) for t in (CLS_TOKEN, SEP_TOKEN, PAD_TOKEN))  # a checkpoint's ids
        ids = [[cls, *p[: self.max_seq_length - 2], sep] for p in pieces]
        device = next(self.model.parameters()).device
        input_ids = torch.full((len(ids), max(map(len, ids))), pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, sequence in enumerate(ids):
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention_mask[row, : len(sequence)] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        hidden, _ = self.model(input_ids, attention_mask=attention_mask)  # (B, T, H)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask[:, :, None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1)
        return pooled.float().cpu().numpy()


def _encoder_stages(cfg: DictConfig) -> tuple[str, ...]:
    return "bert_tokenizer", encoder_stage(cfg)


def _this_run(pooling: str, random_init: bool = False) -> EncoderSpec:
    def build(ctx: StageContext) -> BertEncoder:
        return BertEncoder.from_directories(ctx.stage_dir(encoder_stage(ctx.cfg)) / "encoder",
                                            ctx.stage_dir("bert_tokenizer"), pooling=pooling,
                                            random_init_seed=ctx.cfg.seed if random_init else None,
                                            name=f"bert_{pooling}" + ("_random" if random_init else ""),
                                            fast_kernels=typed_settings(ctx.cfg.trainer, TrainerConfig).fast_kernels)
    return EncoderSpec(_encoder_stages, build, random_twin=None if random_init else f"bert_{pooling}_random")


ENCODERS = {f"bert_{pooling}{suffix}": _this_run(pooling, random_init=bool(suffix))
            for suffix in ("", "_random") for pooling in BERT_POOLINGS}
