"""The frozen biLM as a sentence encoder for the evaluate stage, and its randomly initialised twin."""
from __future__ import annotations

import numpy as np
import torch

from data_prep.examples.elmo_examples import elmo_words, read_word_vocab
from models.checkpoint import random_twin
from models.elmo import ElmoEmbedder, ScalarMix, load_pretrained
from pipeline.data_settings import chinese_words_of
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec


class ElmoSentenceEncoder:
    """SentEval encoder: the mean over words of the frozen biLM's layers mixed with equal weights (an untrained
    ScalarMix, s = 0, gamma = 1), as seed 000's SentEval section uses ELMo."""

    def __init__(self, bilm_dir, vocab: list[str], name: str = "elmo", random_init_seed: int | None = None,
                 chinese_words: str = "jieba"):
        self.name, self.chinese_words = name, chinese_words
        bilm = load_pretrained(bilm_dir)
        bilm = (bilm if random_init_seed is None else random_twin(bilm, random_init_seed)).eval()
        self.embedder = ElmoEmbedder(bilm, vocab)
        self.mix = ScalarMix(bilm.config.num_layers + 1)

    def prepare(self, samples: list[list[str]]) -> None:
        pass

    @torch.no_grad()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        # the probes' tokens re-split into the biLM's words (Chinese as its vocabulary was segmented)
        layers, mask = self.embedder.embed([elmo_words(" ".join(tokens), self.chinese_words)
                                            for tokens in batch])  # (B, L+1, T, 2P), (B, T)
        mixed = self.mix(layers, mask)                                                 # (B, T, 2P)
        weights = mask.unsqueeze(-1).float()
        return ((mixed * weights).sum(1) / weights.sum(1).clamp(min=1)).numpy()


def elmo_encoder(random_init: bool = False):
    """The evaluate stage's builder of this run's biLM encoder, or (random_init) of its randomly initialised twin."""
    def build(ctx: StageContext) -> ElmoSentenceEncoder:
        return ElmoSentenceEncoder(ctx.stage_dir("elmo_pretrain") / "bilm",
                                   read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt"),
                                   name="elmo_random" if random_init else "elmo",
                                   random_init_seed=ctx.cfg.seed if random_init else None,
                                   chinese_words=chinese_words_of(ctx.cfg))
    return build


ENCODERS = {name: EncoderSpec(lambda cfg: ("elmo_vocab", "elmo_pretrain"), elmo_encoder(random_init=random_init),
                              random_twin=None if random_init else "elmo_random")
            for name, random_init in (("elmo", False), ("elmo_random", True))}
