"""ELMo's pretraining and stages (Peters et al. 2018): a word vocabulary and per-book token streams built from the
sentence shards (pipeline/elmo/data_stages.py), then biLM pretraining with truncated BPTT over whole books
(pipeline/elmo/data.py explains why windows, not sentence batches). The frozen biLM then serves the evaluate stage as
a sentence encoder; `hf/` is its representation layers as transformers loads them."""
from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from data_prep.examples.elmo_examples import read_word_vocab
from models.elmo import save_pretrained
from models.hf.elmo import to_hf
from pipeline.elmo.data import LMWindowBatches, build_elmo_datasets
from pipeline.elmo.data_stages import elmo_streams, elmo_vocab
from pipeline.elmo.module import ElmoPretrainModule
from pipeline.elmo.settings import ElmoConfig
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.pretraining import instantiate_model, pretraining_stage
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import typed_settings
from pipeline.schema import PretrainConfig


class WindowPosition:
    """Where truncated-BPTT training stands, for checkpoints: the window batches consumed, and the LSTM state every
    row carries into the next one. The state is saved rather than rebuilt: it is the output of every window since
    each row's book began, which only replaying those windows (with the weights of their time) would give back."""

    def __init__(self, batches: LMWindowBatches, module: ElmoPretrainModule):
        self.batches, self.module = batches, module

    def state_dict(self, batches_consumed: int) -> dict:
        return {"batches": batches_consumed, "lstm_state": self.module.carried_state("train")}

    def load_state_dict(self, state: dict) -> None:
        self.batches.start = state["batches"]
        self.module.carry_state("train", state["lstm_state"])


class ElmoPretraining:
    """biLM pretraining as the harness (pipeline/engine/pretraining.py) runs it: truncated-BPTT window batches,
    each rank over its own books, resumed with the LSTM state its rows carry (WindowPosition)."""

    def settings_key(self, cfg: DictConfig) -> str:
        return "pretrain"

    def settings(self, cfg: DictConfig) -> PretrainConfig:
        return typed_settings(cfg.pretrain, PretrainConfig)

    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> ElmoPretrainModule:
        model = instantiate_model(ctx.cfg,
                                  vocab_size=len(read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt")))
        return ElmoPretrainModule(model, OptimizerSettings.of(settings, self.settings_key(ctx.cfg)))

    def data(self, ctx: StageContext, module: ElmoPretrainModule, settings: PretrainConfig, rank: int,
             world_size: int) -> PretrainingData:
        e = typed_settings(ctx.cfg.elmo, ElmoConfig)
        vocab = read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt")
        train, heldout = build_elmo_datasets(sorted(ctx.stage_dir("elmo_streams").glob("streams-*.arrow")), vocab,
                                             e.window, e.batch_size, e.holdout_books_fraction, e.holdout_max_books,
                                             ctx.cfg.seed,
                                             char_inputs=module.model.config.token_encoder == "char_cnn",
                                             rank=rank, world_size=world_size)
        # batch_size=None and no shuffling: each batch row continues the book the previous batch's row was reading.
        # Generators of their own: creating a loader iterator (a resumed run creates one more) would otherwise draw
        # from the global RNG, which dropout and the sampled softmax's candidates draw from.
        loaders = [DataLoader(d, batch_size=None, generator=torch.Generator().manual_seed(ctx.cfg.seed))
                   for d in (train, heldout)]
        return PretrainingData(loaders[0], WindowPosition(train, module), loaders[1], e.batch_size,
                               uniform_loss=2 * math.log(module.model.config.vocab_size))  # both directions

    def write(self, ctx: StageContext, module: ElmoPretrainModule) -> None:
        save_pretrained(module.model, ctx.out_dir / "bilm")
        # the representation layers and their tokenizer, as transformers' AutoModel loads them (models/hf/elmo.py)
        to_hf(module.model, ctx.out_dir / "hf", read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt"))

    def summary(self, module: ElmoPretrainModule, data: PretrainingData, run: TrainingRun) -> dict:
        # the windows' positions, both directions reading the same tokens; the last windows of a book run short
        return {"heldout_perplexity": module.heldout_perplexities,
                "tokens_seen": run.rows_seen(data.batch_size) * data.train_loader.dataset.window}


ELMO_STAGES = [
    Stage("elmo_vocab", elmo_vocab, ("prepare",), ("elmo.vocab_size", "elmo.min_count")),
    Stage("elmo_streams", elmo_streams, ("prepare",), ()),
    pretraining_stage("elmo_pretrain", ElmoPretraining(), ("elmo_vocab", "elmo_streams"), ("elmo", "pretrain")),
]
