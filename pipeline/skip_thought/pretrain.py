"""Skip-Thought's pretraining and stages (Kiros et al. 2015): a word vocabulary counted over the sentence shards,
(previous, current, next) triples that never cross a book (pipeline/skip_thought/data_stages.py), then pretraining of an
encoder and its two decoders: uni-skip in `skip_thought_pretrain`, bi-skip in `skip_thought_bi_pretrain`, on the same
vocabulary and triples. The trained encoders serve the evaluate stage, alone, concatenated (combine-skip), or with the
vocabulary expanded through GloVe (§2.2 of the paper). Each pretraining stage also writes its encoder and tokenizer as
transformers loads them (`hf/`)."""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass

from omegaconf import DictConfig

from data_prep.examples.skip_thought_examples import TRIPLE_SCHEMA, WordVocab, save_hf_tokenizer
from models.hf.skip_thought import to_hf
from models.skip_thought import save_pretrained
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.pretraining import instantiate_model, pretraining_stage
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import typed_settings
from pipeline.schema import PretrainConfig
from pipeline.skip_thought.data_stages import skip_thought_examples, skip_thought_vocab
from pipeline.skip_thought.module import SkipThoughtPretrainModule, collate_triples
from pipeline.skip_thought.settings import SkipThoughtConfig

# Kiros et al. §3: uni-skip and bi-skip are separate models, each with its own decoders, trained alike; the stage,
# not model.config, says which encoder it trains, so one run can train both for combine-skip.
PRETRAINING_STAGES = {"uni": "skip_thought_pretrain", "bi": "skip_thought_bi_pretrain"}


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

    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> SkipThoughtPretrainModule:
        vocab = WordVocab.load(ctx.stage_dir("skip_thought_vocab") / "vocab.txt")
        model = instantiate_model(ctx.cfg, vocab_size=len(vocab), encoder=self.encoder)
        return SkipThoughtPretrainModule(model, OptimizerSettings.of(settings, self.settings_key(ctx.cfg)))

    def data(self, ctx: StageContext, module: SkipThoughtPretrainModule, p: PretrainConfig, rank: int,
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
        return SkipThoughtData(train_loader, train_loader.sampler, val_loader, p.batch_size,
                               # the previous and the next sentence's decoder
                               uniform_loss=2 * math.log(module.model.config.vocab_size),
                               # each of its three sentences ends in <eos>
                               tokens_per_triple=words / max(len(triples), 1) + 3)

    def write(self, ctx: StageContext, module: SkipThoughtPretrainModule) -> None:
        vocab_file = ctx.stage_dir("skip_thought_vocab") / "vocab.txt"
        save_pretrained(module.model, ctx.out_dir / "model")
        shutil.copy(vocab_file, ctx.out_dir / "model" / "vocab.txt")
        # the encoder and its tokenizer as transformers' AutoModel and AutoTokenizer load them (models/hf/)
        to_hf(module.model, ctx.out_dir / "hf")
        save_hf_tokenizer(WordVocab.load(vocab_file), ctx.out_dir / "hf",
                          model_max_length=typed_settings(ctx.cfg.skip_thought, SkipThoughtConfig).max_words + 1)

    def summary(self, module: SkipThoughtPretrainModule, data: SkipThoughtData, run: TrainingRun) -> dict:
        return {"triples_per_s": round(run.batches_per_s * data.batch_size, 1),
                "tokens_seen": round(run.rows_seen(data.batch_size) * data.tokens_per_triple)}


SKIP_THOUGHT_STAGES = [
    Stage("skip_thought_vocab", skip_thought_vocab, ("prepare",),
          ("skip_thought.vocab_size", "skip_thought.min_count")),
    Stage("skip_thought_examples", skip_thought_examples, ("prepare", "skip_thought_vocab"),
          ("skip_thought.max_words",)),
    *(pretraining_stage(stage, SkipThoughtPretraining(encoder), ("skip_thought_vocab", "skip_thought_examples"),
                        ("pretrain",)) for encoder, stage in PRETRAINING_STAGES.items()),
]
