"""Skip-Thought's pretraining and stages (Kiros et al. 2015): a word vocabulary counted over the sentence shards,
(previous, current, next) triples that never cross a book (pipeline/skip_thought/data_stages.py), then pretraining of an
encoder and its two decoders: uni-skip in `skip_thought_pretrain`, bi-skip in `skip_thought_bi_pretrain`, on the same
vocabulary and triples. The trained encoders serve the evaluate stage, alone, concatenated (combine-skip), or with the
vocabulary expanded through GloVe (§2.2 of the paper). Each pretraining stage also writes its encoder and tokenizer as
transformers loads them (`hf/`).

skip_thought.objective=quick_thought trains Quick-Thoughts' two encoders (Logeswaran & Lee 2018) on the same triples
instead. With pretrain.init_embeddings=word2vec the word embeddings start from the word2vec stage's vectors of the
vocabulary's words (the w2v_mean baseline's, skip-gram on the same corpus), frozen with pretrain.freeze_embeddings:
what Kiros et al.'s vocabulary expansion brings in after training, there from the first step."""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass

import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from conventions.piece_vectors import pieces_with_vectors
from data_prep.corpus.word_vectors import WordVectors
from data_prep.examples.skip_thought_examples import SPECIAL_WORDS, TRIPLE_SCHEMA, WordVocab, save_hf_tokenizer
from models.hf.skip_thought import to_hf
from models.skip_thought import save_pretrained
from pipeline.downstream.word2vec import WORD2VEC, Word2VecConfig, load_word2vec
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.engine.module import OptimizerSettings, PretrainModule
from pipeline.engine.pretraining import (
    instantiate_model,
    keep_word_embeddings,
    pretraining_stage,
    start_word_embeddings,
)
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import typed_settings
from pipeline.schema import PretrainConfig
from pipeline.skip_thought.data_stages import skip_thought_examples, skip_thought_vocab
from pipeline.skip_thought.module import QuickThoughtPretrainModule, SkipThoughtPretrainModule, collate_triples
from pipeline.skip_thought.settings import Objective, SkipThoughtConfig

# Kiros et al. §3: uni-skip and bi-skip are separate models, each with its own decoders, trained alike; the stage,
# not model.config, says which encoder it trains, so one run can train both for combine-skip.
PRETRAINING_STAGES = {"uni": "skip_thought_pretrain", "bi": "skip_thought_bi_pretrain"}


def objective_of(cfg: DictConfig) -> Objective:
    return typed_settings(cfg.skip_thought, SkipThoughtConfig).objective


def starts_from_word2vec(cfg: DictConfig) -> bool:
    """pretrain.init_embeddings=word2vec: the word embeddings start from the word2vec stage's vectors."""
    return typed_settings(cfg.pretrain, PretrainConfig).init_embeddings == "word2vec"


def check_embedding_width(cfg: DictConfig) -> None:
    """Before any stage runs, where the word embeddings start from word2vec: one vector a row, so the model's
    embedding_dim is word2vec's vector_size (a projection would be a layer the control would have to train)."""
    width = instantiate(OmegaConf.select(cfg, "model.config"), vocab_size=len(SPECIAL_WORDS) + 1).embedding_dim
    vector_size = typed_settings(cfg.word2vec, Word2VecConfig).vector_size
    if width != vector_size:
        raise ValueError(f"pretrain.init_embeddings=word2vec starts Skip-Thought's {width}-value word embeddings "
                         f"from word2vec's {vector_size}-value vectors; set ++model.config.embedding_dim={vector_size} "
                         f"(or word2vec.vector_size={width}, which also changes the w2v_mean baseline)")


def word_vector_table(vocab: WordVocab, vectors: WordVectors) -> np.ndarray:
    """(len(vocab), d) float32: each vocabulary word's vector in `vectors`, NaN for a word without one (the special
    words among them), the rows start_word_embeddings leaves at their initialisation. Both sides lower-case."""
    table = np.full((len(vocab), vectors.vectors.shape[1]), np.nan, dtype=np.float32)
    for i, word in enumerate(vocab.words):
        if (row := vectors.index.get(word)) is not None:
            table[i] = vectors.vectors[row]
    return table


def starting_model(cfg: DictConfig, vocab: WordVocab, encoder: str, word_vectors: WordVectors | None) -> nn.Module:
    """What a pretraining stage of `encoder` (uni, bi) starts from before its first step: the model config's
    architecture for `vocab`, of skip_thought.objective's class, from the run's seed, its word embeddings set to
    `word_vectors` (the word2vec stage's, where pretraining starts from them). The control kinds use it untrained."""
    model = instantiate_model(cfg, vocab_size=len(vocab), encoder=encoder, objective=str(objective_of(cfg)))
    if word_vectors is not None:
        start_word_embeddings(model.embedding, word_vector_table(vocab, word_vectors))
    return model


@dataclass
class SkipThoughtData(PretrainingData):
    tokens_per_triple: float  # the words of its three sentences and their <eos>, over all triples


class SkipThoughtPretraining:
    """Encoder (`encoder`: uni or bi) and decoders trained as the harness (pipeline/engine/pretraining.py) runs it, on
    seeded resumable batches of triples, each rank its own."""

    def settings_key(self, cfg: DictConfig) -> str:
        return "pretrain"

    def __init__(self, encoder: str):
        self.encoder = encoder

    def settings(self, cfg: DictConfig) -> PretrainConfig:
        return typed_settings(cfg.pretrain, PretrainConfig)

    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> PretrainModule:
        vocab = WordVocab.load(ctx.stage_dir("skip_thought_vocab") / "vocab.txt")
        # a resumed run then loads its own checkpoint over these
        word_vectors = load_word2vec(ctx.stage_dir(WORD2VEC.name)) if starts_from_word2vec(ctx.cfg) else None
        model = starting_model(ctx.cfg, vocab, self.encoder, word_vectors)
        # Kept as they start: at this compute the objective pulls trainable vectors toward what predicts the next
        # words, and the sentiment that skip-gram placed in them is lost (BERT's frozen start,
        # docs/pretraining_recipes.md); with_vector keeps the words word2vec has and trains the others
        keep_word_embeddings(model.embedding, settings.freeze_embeddings,
                             None if word_vectors is None else
                             pieces_with_vectors(word_vector_table(vocab, word_vectors)))
        module = (SkipThoughtPretrainModule if objective_of(ctx.cfg) == Objective.skip_thought
                  else QuickThoughtPretrainModule)
        return module(model, OptimizerSettings.of(settings, self.settings_key(ctx.cfg)))

    def data(self, ctx: StageContext, module: PretrainModule, p: PretrainConfig, rank: int,
             world_size: int) -> SkipThoughtData:
        tables = [read_arrow(f) for f in sorted(ctx.stage_dir("skip_thought_examples").glob("triples-*.arrow"))]
        triples = ArrowRows(tables, TRIPLE_SCHEMA.names)
        if len(triples) < 2:
            raise ValueError(f"only {len(triples)} Skip-Thought triples; a book needs at least 3 sentences to give "
                             "one. Use a larger corpus or lower data.min_tokens")
        train_loader, val_loader = pretraining_loaders(triples, collate_triples, p.batch_size, p.val_fraction,
                                                       p.val_max_instances, ctx.cfg.seed, p.num_workers, rank,
                                                       world_size)
        words = sum(len(values) for name in TRIPLE_SCHEMA.names for values in triples.values(name))
        # two log-probabilities: the previous and the next sentence's decoder (each over the vocabulary), or the
        # previous and the next sentence among the batch's 2B candidates
        choices = module.model.config.vocab_size if isinstance(module, SkipThoughtPretrainModule) else 2 * p.batch_size
        return SkipThoughtData(train_loader, train_loader.sampler, val_loader, p.batch_size,
                               uniform_loss=2 * math.log(choices),
                               # each of its three sentences ends in <eos>
                               tokens_per_triple=words / max(len(triples), 1) + 3)

    def write(self, ctx: StageContext, module: PretrainModule) -> None:
        vocab_file = ctx.stage_dir("skip_thought_vocab") / "vocab.txt"
        save_pretrained(module.model, ctx.out_dir / "model")
        shutil.copy(vocab_file, ctx.out_dir / "model" / "vocab.txt")
        # the encoder and its tokenizer as transformers' AutoModel and AutoTokenizer load them (models/hf/)
        to_hf(module.model, ctx.out_dir / "hf")
        save_hf_tokenizer(WordVocab.load(vocab_file), ctx.out_dir / "hf",
                          model_max_length=typed_settings(ctx.cfg.skip_thought, SkipThoughtConfig).max_words + 1)

    def summary(self, module: PretrainModule, data: SkipThoughtData, run: TrainingRun) -> dict:
        return {"triples_per_s": round(run.batches_per_s * data.batch_size, 1),
                "tokens_seen": round(run.rows_seen(data.batch_size) * data.tokens_per_triple)}


def pretraining_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """What a pretraining stage reads: the vocabulary, the triples, and the word vectors its embeddings start from."""
    return ("skip_thought_vocab", "skip_thought_examples") + ((WORD2VEC.name,) if starts_from_word2vec(cfg) else ())


SKIP_THOUGHT_STAGES = [
    Stage("skip_thought_vocab", skip_thought_vocab, ("prepare",),
          ("skip_thought.vocab_size", "skip_thought.min_count")),
    Stage("skip_thought_examples", skip_thought_examples, ("prepare", "skip_thought_vocab"),
          ("skip_thought.max_words",)),
    *(pretraining_stage(stage, SkipThoughtPretraining(encoder), pretraining_upstream,
                        ("pretrain", "skip_thought.objective")) for encoder, stage in PRETRAINING_STAGES.items()),
]
