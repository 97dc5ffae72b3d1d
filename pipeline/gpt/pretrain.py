"""GPT's pretraining (Radford et al. 2018; GPT-2): causal-LM pretraining on the shared harness, and GPT's stages: a
byte-level BPE trained on the sentence shards, the books of each shard packed into fixed-length blocks
(data_prep/examples/gpt_blocks.py, pipeline/gpt/data_stages.py), then that pretraining; with
pretrain.init_embeddings=word2vec, from skip-gram vectors of the byte-level pieces (gpt_piece_vectors).
The pretrained LM is written in our format (`model/`, read by evaluate, fine-tuning and pipeline.generate) and as a
HuggingFace GPT-2 directory (`hf/`)."""
from __future__ import annotations

import math
import shutil
from dataclasses import fields

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from data_prep.examples.gpt_blocks import TOKENIZER_FILE, end_of_text_id, load_gpt_tokenizer, write_hf_tokenizer_config
from models.gpt import GPTConfig, save_pretrained
from models.hf.gpt import to_hf
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.pretraining import (
    instantiate_model,
    merged_settings,
    pretraining_stage,
    start_piece_embeddings,
)
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import model_key, typed_settings
from pipeline.gpt.data_stages import gpt_blocks, gpt_piece_vectors, gpt_tokenizer
from pipeline.gpt.module import BLOCK_COLUMN, GPTPretrainModule, collate_blocks
from pipeline.gpt.settings import GptDataConfig, GptPretrainConfig
from pipeline.piece_vectors import read_piece_vectors
from pipeline.schema import PretrainConfig


class GPTPretraining:
    """Causal-LM pretraining as the harness (pipeline/engine/pretraining.py) runs it, on seeded resumable batches of
    blocks, each rank its own. Its settings are gpt.pretrain's keys over pretrain's, and its model is gpt.model where
    the run has one, else `model`: so one run can pretrain BERT too (experiment=bert_vs_gpt)."""

    def settings_key(self, cfg: DictConfig) -> str:
        """The block a message asks to change: gpt.pretrain where the run gives GPT settings of its own, else pretrain
        (a GPT-only run, whose gpt.pretrain is all null)."""
        return "gpt.pretrain" if own_pretraining_settings(cfg) else "pretrain"

    def settings(self, cfg: DictConfig) -> PretrainConfig:
        return merged_settings(cfg, ("pretrain", "gpt.pretrain"))

    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> GPTPretrainModule:
        cfg = ctx.cfg
        model = instantiate_model(cfg, model_key(cfg, "gpt"),
                                  **data_config_values(cfg, load_gpt_tokenizer(ctx.stage_dir("gpt_tokenizer"))))
        # The LM head is this table (tied, Press & Wolf 2017), so frozen embeddings freeze the output layer too: the
        # LM learns states that point at the next piece's fixed vector, the piece vectors' geometry kept for the
        # sentence classifier (Kim 2014's "static" word2vec input; BERT's frozen start, docs/pretraining_recipes.md);
        # with_vector keeps the rows that have a piece vector and trains the others
        start_piece_embeddings(model.transformer.wte, settings,
                               lambda: read_piece_vectors(ctx.stage_dir("gpt_piece_vectors")))
        return GPTPretrainModule(model, OptimizerSettings.of(settings, self.settings_key(cfg)))

    def data(self, ctx: StageContext, module: GPTPretrainModule, p: PretrainConfig, rank: int,
             world_size: int) -> PretrainingData:
        blocks = ArrowRows([read_arrow(f) for f in sorted(ctx.stage_dir("gpt_blocks").glob("blocks-*.arrow"))],
                           [BLOCK_COLUMN])
        if len(blocks) < 2:
            raise ValueError(f"only {len(blocks)} GPT blocks: the corpus is shorter than two blocks; use a larger "
                             "corpus or lower gpt.block_size")
        train, val = pretraining_loaders(blocks, collate_blocks, p.batch_size, p.val_fraction, p.val_max_instances,
                                         ctx.cfg.seed, p.num_workers, rank, world_size)
        return PretrainingData(train, train.sampler, val, p.batch_size,
                               uniform_loss=math.log(module.model.config.vocab_size))

    def write(self, ctx: StageContext, module: GPTPretrainModule) -> None:
        tokenizer_dir = ctx.stage_dir("gpt_tokenizer")
        for out, save in ((ctx.out_dir / "model", save_pretrained), (ctx.out_dir / "hf", to_hf)):
            save(module.model, out)
            shutil.copy(tokenizer_dir / TOKENIZER_FILE, out / TOKENIZER_FILE)
        write_hf_tokenizer_config(ctx.out_dir / "hf", module.model.config.n_positions)

    def summary(self, module: GPTPretrainModule, data: PretrainingData, run: TrainingRun) -> dict:
        batch_tokens = data.batch_size * module.model.config.n_positions
        return {"heldout_perplexity": module.heldout_perplexity,
                "tokens_per_s": round(run.batches_per_s * batch_tokens, 1),
                "tokens_seen": run.rows_seen(data.batch_size) * module.model.config.n_positions}


def data_config_values(cfg: DictConfig, tok: Tokenizer) -> dict:
    """What only the data sets of the GPT's config: the tokenizer's vocabulary and end-of-text token, and the context,
    which is the training length (positions past it would keep their random init)."""
    return {"vocab_size": tok.get_vocab_size(), "eos_token_id": end_of_text_id(tok),
            "n_positions": typed_settings(cfg.gpt, GptDataConfig).block_size}


def scratch_config(cfg: DictConfig, tok: Tokenizer) -> GPTConfig:
    """The architecture of the GPT that gpt_pretrain builds for tokenizer `tok`, known without running it."""
    return instantiate(OmegaConf.select(cfg, model_key(cfg, "gpt")).config, **data_config_values(cfg, tok))


def pretraining_starts_from_piece_vectors(cfg: DictConfig) -> bool:
    """pretrain.init_embeddings=word2vec (gpt.pretrain's where it sets it)."""
    return GPTPretraining().settings(cfg).init_embeddings == "word2vec"


def pretraining_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """What gpt_pretrain reads: the tokenizer, the blocks, and the piece vectors its token embeddings start from."""
    return ("gpt_tokenizer", "gpt_blocks") + (("gpt_piece_vectors",) if pretraining_starts_from_piece_vectors(cfg)
                                              else ())


def own_pretraining_settings(cfg: DictConfig) -> list[str]:
    """The keys gpt.pretrain sets (not null): where GPT's pretraining differs from `pretrain`."""
    own = typed_settings(cfg.gpt.pretrain, GptPretrainConfig)
    return [entry.name for entry in fields(own) if getattr(own, entry.name) is not None]


GPT_STAGES = (
    Stage("gpt_tokenizer", gpt_tokenizer, ("prepare",), ("gpt.vocab_size", "gpt.min_frequency", "gpt.max_sentences")),
    Stage("gpt_blocks", gpt_blocks, ("prepare", "gpt_tokenizer"), ("gpt.block_size",)),
    # pretrain.init_embeddings=word2vec: skip-gram vectors of the byte-level pieces, the token embeddings' start
    Stage("gpt_piece_vectors", gpt_piece_vectors, ("prepare", "gpt_tokenizer"),
          lambda cfg: ("word2vec", model_key(cfg, "gpt"), "seed")),
    pretraining_stage("gpt_pretrain", GPTPretraining(), pretraining_upstream, ("gpt", "pretrain")),
)
