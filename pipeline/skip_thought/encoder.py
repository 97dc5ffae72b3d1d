"""The trained Skip-Thought encoders as sentence encoders for the evaluate stage: uni-skip, bi-skip and combine-skip
(the two concatenated, Kiros et al. §3), each optionally with its vocabulary expanded through GloVe, and the randomly
initialised twin of each."""
from __future__ import annotations

import numpy as np
import torch

from data_prep.corpus.word_vectors import (
    ExpandedVocabulary,
    WordVectors,
    fit_vocabulary_expansion,
    load_glove,
    shared_words,
)
from data_prep.examples.skip_thought_examples import WordVocab, tokenize
from models.checkpoint import random_twin
from models.skip_thought import CombineSkip, SkipThoughts, load_pretrained
from pipeline.data_settings import chinese_words_of
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.skip_thought.module import pad_sentences
from pipeline.skip_thought.pretrain import PRETRAINING_STAGES


class SkipThoughtSentenceEncoder:
    """SentEval encoder over one Skip-Thought model, or over a uni-skip and a bi-skip model concatenated (combine-skip,
    CombineSkip), and their word vocabulary. With `expand_vocabulary`, words the encoder never saw get GloVe vectors
    mapped into each model's embedding space by the least-squares map of Kiros et al. §2.2; combine-skip fits one map
    per half, as each half learned its own embedding table."""

    def __init__(self, models: list[SkipThoughts], vocab: WordVocab, name: str, expand_vocabulary: bool = False):
        self.name, self.vocab, self.parts = name, vocab, [m.eval() for m in models]
        self.model = self.parts[0] if len(self.parts) == 1 else CombineSkip(*self.parts)
        self.expanded: list[ExpandedVocabulary] | None = None
        if expand_vocabulary:
            glove = load_glove()
            self.expanded = []
            for part in self.parts:
                own = WordVectors(tuple(self.vocab.words), part.embedding.weight.detach().numpy())
                self.expanded.append(ExpandedVocabulary(own, glove,
                                                        fit_vocabulary_expansion(glove, own, shared_words(glove, own))))

    def prepare(self, samples: list[list[str]]) -> None:
        pass

    @torch.no_grad()
    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        texts = [" ".join(tokens) for tokens in batch]
        if self.expanded is None:
            ids, lengths = pad_sentences([self.vocab.encode(t) for t in texts])
            return self.model.encode(ids, lengths).numpy()
        sentences = [tokenize(t, self.vocab.chinese_words) for t in texts]
        # (B, D) per part, concatenated uni then bi as CombineSkip.encode does
        return np.concatenate([part.encode_embedded(*expanded.embed_sentences(sentences)).numpy()
                               for part, expanded in zip(self.parts, self.expanded)], axis=1)


def skip_thought_encoder(name: str, encoders: tuple[str, ...], expand_vocabulary: bool = False,
                         random_init: bool = False) -> EncoderSpec:
    """The evaluate stage's `name`: the models trained by the pretraining stages of `encoders` ("uni", "bi"; both:
    combine-skip), or (random_init) their randomly initialised twins, which concatenate as the trained ones do."""
    stages = tuple(PRETRAINING_STAGES[e] for e in encoders)

    def build(ctx: StageContext) -> SkipThoughtSentenceEncoder:
        models = [load_pretrained(ctx.stage_dir(stage) / "model") for stage in stages]
        if random_init:
            models = [random_twin(model, ctx.cfg.seed) for model in models]
        # the stages copy the one vocabulary stage's file next to their model
        vocab = WordVocab.load(ctx.stage_dir(stages[0]) / "model" / "vocab.txt",
                               chinese_words_of(ctx.cfg))
        return SkipThoughtSentenceEncoder(models, vocab, name, expand_vocabulary)
    # an expanded vocabulary has no random twin: the random words' map to GloVe would be fitted to noise
    twin = None if random_init or expand_vocabulary else f"{name}_random"
    return EncoderSpec(lambda cfg: stages, build, random_twin=twin)


ENCODERS = {name: skip_thought_encoder(name, encoders, expand, random_init)
            for name, encoders, expand, random_init in (
                ("skip_thought", ("uni",), False, False), ("skip_thought_random", ("uni",), False, True),
                ("skip_thought_expanded", ("uni",), True, False),
                ("skip_thought_bi", ("bi",), False, False), ("skip_thought_bi_random", ("bi",), False, True),
                ("skip_thought_bi_expanded", ("bi",), True, False),
                ("skip_thought_combine", ("uni", "bi"), False, False),
                ("skip_thought_combine_random", ("uni", "bi"), False, True),
                ("skip_thought_combine_expanded", ("uni", "bi"), True, False))}
