"""The trained Skip-Thought encoders as sentence encoders for the evaluate stage: uni-skip, bi-skip and combine-skip
(the two concatenated, Kiros et al. §3), each optionally with its vocabulary expanded through GloVe, the randomly
initialised twin of each, and each one's control: the model its pretraining started from, word embeddings from
word2vec under random recurrent layers, without a pretraining step."""
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
from models.skip_thought import CombineSkip, QuickThoughts, SkipThoughts, load_pretrained
from pipeline.data_settings import chinese_words_of
from pipeline.downstream.word2vec import WORD2VEC, load_word2vec
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.skip_thought.module import pad_sentences
from pipeline.skip_thought.pretrain import PRETRAINING_STAGES, starting_model


class SkipThoughtSentenceEncoder:
    """SentEval encoder over one Skip-Thought model, or over a uni-skip and a bi-skip model concatenated (combine-skip,
    CombineSkip), and their word vocabulary. With `expand_vocabulary`, words the encoder never saw get GloVe vectors
    mapped into each model's embedding space by the least-squares map of Kiros et al. §2.2; combine-skip fits one map
    per half, as each half learned its own embedding table."""

    def __init__(self, models: list[SkipThoughts | QuickThoughts], vocab: WordVocab, name: str,
                 expand_vocabulary: bool = False):
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
                         start: str = "pretrained") -> EncoderSpec:
    """The evaluate stage's `name`: the models trained by the pretraining stages of `encoders` ("uni", "bi"; both:
    combine-skip; `start` pretrained), their randomly initialised twins (random), or the models those stages start
    from with pretrain.init_embeddings=word2vec, no step taken (word2vec: the controls), which concatenate as the
    trained ones do."""
    stages = tuple(PRETRAINING_STAGES[e] for e in encoders)

    def build(ctx: StageContext) -> SkipThoughtSentenceEncoder:
        chinese_words = chinese_words_of(ctx.cfg)
        if start == "word2vec":
            vocab = WordVocab.load(ctx.stage_dir("skip_thought_vocab") / "vocab.txt", chinese_words)
            word_vectors = load_word2vec(ctx.stage_dir(WORD2VEC.name))
            models = [starting_model(ctx.cfg, vocab, encoder, word_vectors) for encoder in encoders]
            return SkipThoughtSentenceEncoder(models, vocab, name, expand_vocabulary)
        models = [load_pretrained(ctx.stage_dir(stage) / "model") for stage in stages]
        if start == "random":
            models = [random_twin(model, ctx.cfg.seed) for model in models]
        # the stages copy the one vocabulary stage's file next to their model
        vocab = WordVocab.load(ctx.stage_dir(stages[0]) / "model" / "vocab.txt", chinese_words)
        return SkipThoughtSentenceEncoder(models, vocab, name, expand_vocabulary)
    # an expanded vocabulary has no random twin: the random words' map to GloVe would be fitted to noise
    twin = f"{name}_random" if start == "pretrained" and not expand_vocabulary else None
    # the control reads no pretraining stage: it waits for none
    upstream = (lambda cfg: ("skip_thought_vocab", WORD2VEC.name)) if start == "word2vec" else (lambda cfg: stages)
    return EncoderSpec(upstream, build, random_twin=twin)


# the evaluate stage's names of each architecture: its pretraining stages' encoders
ARCHITECTURES = {"skip_thought": ("uni",), "skip_thought_bi": ("bi",), "skip_thought_combine": ("uni", "bi")}
ENCODERS = {f"{name}{suffix}": skip_thought_encoder(f"{name}{suffix}", encoders, expand, start)
            for name, encoders in ARCHITECTURES.items()
            for suffix, expand, start in (("", False, "pretrained"), ("_random", False, "random"),
                                          ("_expanded", True, "pretrained"), ("_w2v", False, "word2vec"))}
