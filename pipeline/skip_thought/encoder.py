"""The trained Skip-Thought encoder as a sentence encoder for the evaluate stage (optionally with its vocabulary
expanded through GloVe), and its randomly initialised twin."""
from __future__ import annotations

import numpy as np
import torch

from data_prep.skip_thought_examples import WordVocab, pad_sentences, tokenize
from data_prep.word_vectors import ExpandedVocabulary, WordVectors, fit_vocabulary_expansion, load_glove, shared_words
from models.checkpoint import random_twin
from models.skip_thought import load_pretrained
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec


class SkipThoughtSentenceEncoder:
    """SentEval encoder over a trained Skip-Thought encoder. With `expand_vocabulary`, words the encoder never saw
    get GloVe vectors mapped into its embedding space by the least-squares map of Kiros et al. §2.2."""

    def __init__(self, model_dir, expand_vocabulary: bool, name: str = "skip_thought",
                 random_init_seed: int | None = None):
        self.name = name
        model = load_pretrained(model_dir)
        self.model = (model if random_init_seed is None else random_twin(model, random_init_seed)).eval()
        self.vocab = WordVocab.load(model_dir / "vocab.txt")
        self.expanded = None
        if expand_vocabulary:
            own = WordVectors(tuple(self.vocab.words), self.model.embedding.weight.detach().numpy())
            glove = load_glove()
            weight = fit_vocabulary_expansion(glove, own, shared_words(glove, own))
            self.expanded = ExpandedVocabulary(own, glove, weight)

    def prepare(self, samples: list[list[str]]) -> None:
        pass

    @torch.no_grad()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        texts = [" ".join(tokens) for tokens in batch]
        if self.expanded is None:
            ids, lengths = pad_sentences([self.vocab.encode(t) for t in texts])
            return self.model.encode(ids, lengths).numpy()
        embedded, lengths = self.expanded.embed_sentences([tokenize(t) for t in texts])
        return self.model.encode_embedded(embedded, lengths).numpy()


def skip_thought_encoder(expand_vocabulary: bool, random_init: bool = False):
    def build(ctx: StageContext) -> SkipThoughtSentenceEncoder:
        name = "skip_thought" + ("_expanded" if expand_vocabulary else "") + ("_random" if random_init else "")
        return SkipThoughtSentenceEncoder(ctx.stage_dir("skip_thought_pretrain") / "model", expand_vocabulary,
                                          name=name, random_init_seed=ctx.cfg.seed if random_init else None)
    return build


ENCODERS = {name: EncoderSpec(lambda cfg: ("skip_thought_pretrain",), skip_thought_encoder(expand, random_init))
            for name, expand, random_init in (("skip_thought", False, False), ("skip_thought_random", False, True),
                                              ("skip_thought_expanded", True, False))}
