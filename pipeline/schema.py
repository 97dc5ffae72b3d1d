"""Typed schemas of the config blocks every run has (Hydra structured configs), with their defaults: the one place a
setting's default lives and is explained (conf/config.yaml only picks the config groups: model, trainer, logger, ...;
experiments state what they change). Each key has a type, an enum where it takes one of a few names, so a bad value
fails at composition with Hydra's message naming the key (`pretrain.lr=abc`, `pretrain.optimizer=adam`). A block a
model family owns is defined the same way in the family's folder (Family.config); the blocks the data stages read
(paths, ray, data) are in pipeline/engine/settings.py and pipeline/data_settings.py, which load no torch, and the
SentEval probes' block (`senteval`) beside the runner that reads it, pipeline/evaluation/senteval.py.
pipeline/config.py assembles them with the trainer's (pipeline/engine/training.py), the data-parallel settings'
(pipeline/engine/distributed.py), the families' own blocks and what the stage graph names (stages, fine-tune kinds,
encoders) into the root schema.

A block built by `_target_` (trainer, logger, model) is open: besides its typed fields it takes any argument of its
target, which pipeline/engine/settings.py checks against the target's signature before any work; its values are
the config group's option files (conf/trainer/cpu.yaml, conf/model/bert_tiny.yaml)."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any, Optional, get_type_hints

from omegaconf import MISSING

from pipeline.engine.settings import COUNT, NULL_KEEPS, POSITIVE_INT, RANGE, RATE, Number, ranged

# Field metadata of a block a run may leave null, naming the block that stands in for it then (gpt.model: `model`)
NULL_MEANS = "null_means"

# pretrain.optimizer and pretrain.lr_decay name what pipeline/engine/optim.py builds; the names are kept here, where
# no torch is loaded, so that every family's settings.py, read by torch-free data stages, can build on PretrainConfig
PretrainOptimizer = StrEnum("PretrainOptimizer", {name: name for name in ("adamw", "lamb")}, module=__name__)
# the shape of the decay from the peak lr after the warmup. Linear warmup then linear decay is also the "one-cycle" of
# Izsak et al. 2021 (BERT in 24 h); both reach 0 at max_steps. noam: the Transformer's inverse square root (noam_rate,
# Vaswani et al. 2017 eq. 3), which never reaches 0.
LR_DECAYS = ("linear", "cosine", "noam")
LrDecay = StrEnum("LrDecay", {name: name for name in LR_DECAYS}, module=__name__)
# pretrain.init_embeddings: where the token embeddings start, random (the model's initialiser) or word2vec (skip-gram
# vectors of the corpus's pieces: BERT's bert_piece_vectors stage, GPT's gpt_piece_vectors, the encoder-decoder's
# seq2seq_piece_vectors; of its words: the word2vec stage's, for Skip-Thought)
InitEmbeddings = StrEnum("InitEmbeddings", {name: name for name in ("random", "word2vec")}, module=__name__)
# pretrain.freeze_embeddings and finetune.freeze_embeddings: which rows of the token embeddings stay as they start.
# all: the whole table; with_vector: the rows started from a vector (a piece vector, Skip-Thought's word2vec words),
# the others, pieces the corpus shows too rarely for skip-gram and so at their random initialisation, train
# (pipeline.engine.pretraining.keep_word_embeddings); none: every row trains. The rule is the same in pretraining and
# fine-tuning, for the pretrained kind and its control; a random twin trains every row.
FREEZE_EMBEDDINGS = ("all", "with_vector", "none")
FreezeEmbeddings = StrEnum("FreezeEmbeddings", {name: name for name in FREEZE_EMBEDDINGS}, module=__name__)


@dataclass
class PretrainConfig:
    """What every family's pretraining reads (the harness: steps, validation, checkpoints, snapshots; the optimizer)."""
    max_steps: int = ranged(1000, POSITIVE_INT)
    batch_size: int = ranged(32, POSITIVE_INT)
    # docs/pretraining_recipes.md: 1e-3 stays on the plateau longer, 5e-3 diverges to it
    lr: float = ranged(2e-3, RATE)
    warmup_steps: int = ranged(100, COUNT)
    # linear | cosine: the decay to 0 after the warmup (docs/pretraining_recipes.md, "The shape, the masking rate, the
    # schedule"); noam: seed 000's inverse square root, peaking at lr (pipeline/engine/optim.py)
    lr_decay: LrDecay = LrDecay.linear
    weight_decay: float = ranged(0.01, Number(float, 0))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: Optional[float] = 1.0
    optimizer: PretrainOptimizer = PretrainOptimizer.adamw  # lamb: You et al. 2019, for large batches
    # optimizer step every N batches: effective batch = N x batch_size x workers
    accumulate_grad_batches: int = ranged(1, POSITIVE_INT)
    # all held out leaves nothing to train on: val_fraction=1 passed start-up and failed in pretraining
    val_fraction: float = ranged(0.02, Number(float, 0, 1, high_open=True, why="the held-out share; the rest trains"))
    # at most this many held out: 2 % of a book-scale corpus is 10^5-10^6 instances, held masked in memory and scored
    # at every validation (google-research/bert's run_pretraining evaluates 100 batches of 8)
    val_max_instances: int = ranged(5000, POSITIVE_INT)
    val_every_steps: int = ranged(250, POSITIVE_INT)
    # a killed run resumes from the last of these, data position included
    checkpoint_every_steps: int = ranged(200, POSITIVE_INT)
    num_workers: int = 0  # DataLoader worker processes
    # Steps at which the encoder is also written, to encoder_snapshots/step-<N>/ of the stage; the fine-tune stage then
    # fine-tunes each next to the final encoder (pretrain_scaling.png; experiment bert_small_books). A snapshot is the
    # run at that step, with its learning rate not yet decayed: not what a run of N steps would give.
    encoder_snapshots: list[int] = field(default_factory=list)
    # Where the token embeddings start: random, or word2vec (skip-gram over the corpus written in the model's own
    # pieces, with the `word2vec` block's settings; Skip-Thought's words: the word2vec stage's vectors); and which of
    # their rows pretraining keeps as they start (FREEZE_EMBEDDINGS). BERT, GPT, Skip-Thought and seq2seq read both
    # (BERT not with pretrain.init_from, whose embeddings are the checkpoint's); ELMo does not.
    init_embeddings: InitEmbeddings = InitEmbeddings.random
    freeze_embeddings: FreezeEmbeddings = FreezeEmbeddings.none


@dataclass
class TargetConfig:
    """A block built by `_target_` (logger, model): open to the target's arguments."""
    _target_: str = MISSING


@dataclass
class ModelConfig(TargetConfig):
    config: Any = MISSING  # the model config function's arguments (models/), some set from the data at run time


# blocks built by `_target_`, and the callbacks (name -> such a block): keys beyond their fields are allowed
OPEN_BLOCKS = ("trainer", "logger", "model", "callbacks")


def override_block(name: str, module: str, schemas: tuple[type, ...], defaults: dict[str, Any] | None = None,
                   own: tuple[tuple[str, type, Any], ...] = ()) -> type:
    """The schema of a block whose keys are those of `schemas` and override theirs: each optional and null, where the
    block keeps the value of the one it overrides, unless `defaults` gives it one; a value it sets is in the range the
    key has there (pipeline/engine/settings.py check_ranges); a nested block (pretrain.electra)
    is such a block of its own, never null, as OmegaConf cannot merge an override into a null typed block. `own`:
    fields of its own, first (pretrain_phase2's max_seq_length). pipeline/engine/pretraining.py merged_settings reads
    such a block over the other. Bound to `name` in `module`, where pickle finds it (a sweep sends the config to its
    trials)."""
    hints = {key: kind for schema in schemas for key, kind in get_type_hints(schema).items()}
    ranges = {entry.name: entry.metadata[RANGE] for schema in schemas for entry in dataclasses.fields(schema)
              if RANGE in entry.metadata}
    defaults = defaults or {}
    fields = []
    for key, kind in hints.items():
        if dataclasses.is_dataclass(kind):
            nested = override_block(f"{name}{kind.__name__}", module, (kind,))
            fields.append((key, nested, field(default_factory=nested)))
        elif key in ranges:
            fields.append((key, Optional[kind], field(default=defaults.get(key),
                                                      metadata={RANGE: ranges[key], NULL_KEEPS: True})))
        else:
            fields.append((key, Optional[kind], defaults.get(key)))
    cls = make_dataclass(name, [*own, *fields])
    cls.__module__ = module
    setattr(sys.modules[module], name, cls)
    return cls
