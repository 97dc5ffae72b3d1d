"""Typed schemas of the config blocks every run has (Hydra structured configs): the type of each key, an enum where a
key takes one of a few names, so a bad value fails at composition with Hydra's message naming the key
(`pretrain.lr=abc`, `pretrain.optimizer=adam`). The values and their comments stay in conf/config.yaml; a field's
default here is MISSING, so these say what a key is, never what it is set to (a block a model family owns is defined
whole, with its defaults, in the family's folder: Family.config). pipeline/config.py assembles them with the trainer's
(pipeline/engine/training.py), the data-parallel settings' (pipeline/engine/distributed.py), the families' own blocks
(Family.config) and what the stage graph names (stages, fine-tune kinds, encoders) into the root schema.

A block built by `_target_` (trainer, logger, model) is open: besides its typed fields it takes any argument of its
target, which pipeline/engine/settings.py checks against the target's signature before any work."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any, Optional, get_type_hints

from omegaconf import MISSING

from data_prep.corpus.builtin import BUILTIN_CORPORA
from data_prep.corpus.chinese import CHINESE_VARIANTS, CHINESE_WORDS
from pipeline.engine.optim import LR_DECAYS, PRETRAIN_OPTIMIZERS
from pipeline.evaluation.senteval import PAIR_FEATURES

# Field metadata of a block a run may leave null, naming the block that stands in for it then (gpt.model: `model`)
NULL_MEANS = "null_means"

PretrainOptimizer = StrEnum("PretrainOptimizer", {name: name for name in PRETRAIN_OPTIMIZERS}, module=__name__)
LrDecay = StrEnum("LrDecay", {name: name for name in LR_DECAYS}, module=__name__)
InputFormat = StrEnum("InputFormat", {name: name for name in ("raw", "sentence_per_line")}, module=__name__)
BuiltinCorpus = StrEnum("BuiltinCorpus", {name: name for name in BUILTIN_CORPORA}, module=__name__)
ChineseVariant = StrEnum("ChineseVariant", {name: name for name in CHINESE_VARIANTS}, module=__name__)
ChineseWords = StrEnum("ChineseWords", {name: name for name in CHINESE_WORDS}, module=__name__)
PairFeature = StrEnum("PairFeature", {name: name for name in PAIR_FEATURES}, module=__name__)


@dataclass
class PathsConfig:
    cache_dir: str = MISSING
    run_dir: str = MISSING


@dataclass
class RayConfig:
    num_cpus: int = MISSING
    address: Optional[str] = MISSING


@dataclass
class DataConfig:
    corpus: BuiltinCorpus = MISSING
    corpus_dir: Optional[str] = MISSING
    glob: str = MISSING
    input_format: InputFormat = MISSING
    shard_bytes: int = MISSING
    min_tokens: int = MISSING
    max_tokens: int = MISSING
    nfkc: bool = MISSING
    near_duplicate_threshold: Optional[float] = MISSING
    decontaminate: bool = MISSING
    decontamination_ngram: int = MISSING
    chinese_variant: ChineseVariant = MISSING
    chinese_words: ChineseWords = MISSING


@dataclass
class PretrainConfig:
    """What every family's pretraining reads (the harness: steps, validation, checkpoints, snapshots; the optimizer)."""
    max_steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    warmup_steps: int = MISSING
    lr_decay: LrDecay = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    grad_clip: Optional[float] = MISSING
    optimizer: PretrainOptimizer = MISSING
    accumulate_grad_batches: int = MISSING
    val_fraction: float = MISSING
    val_max_instances: int = MISSING
    val_every_steps: int = MISSING
    checkpoint_every_steps: int = MISSING
    num_workers: int = MISSING
    encoder_snapshots: list[int] = MISSING


@dataclass
class TargetConfig:
    """A block built by `_target_` (logger, model): open to the target's arguments."""
    _target_: str = MISSING


@dataclass
class ModelConfig(TargetConfig):
    config: Any = MISSING  # the model config function's arguments (models/), some set from the data at run time


@dataclass
class ClassifierConfig:
    l2_grid: list[float] = MISSING
    max_iter: int = MISSING
    cv_folds: int = MISSING
    inner_folds: int = MISSING


@dataclass
class SentevalConfig:
    data_root: str = MISSING
    batch_size: int = MISSING
    pair_features: list[PairFeature] = MISSING
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    tasks: dict[str, Any] = MISSING  # name -> {kind, path, ...}; the kinds are pipeline/evaluation/senteval.py's


# blocks built by `_target_`, and the callbacks (name -> such a block): keys beyond their fields are allowed
OPEN_BLOCKS = ("trainer", "logger", "model", "callbacks")


def override_block(name: str, module: str, schemas: tuple[type, ...], defaults: dict[str, Any] | None = None,
                   own: tuple[tuple[str, type, Any], ...] = ()) -> type:
    """The schema of a block whose keys are those of `schemas` and override theirs: each optional and null, where the
    block keeps the value of the one it overrides, unless `defaults` gives it one; a nested block (pretrain.electra)
    is such a block of its own, never null, as OmegaConf cannot merge an override into a null typed block. `own`:
    fields of its own, first (pretrain_phase2's max_seq_length). pipeline/engine/pretraining.py merged_settings reads
    such a block over the other. Bound to `name` in `module`, where pickle finds it (a sweep sends the config to its
    trials)."""
    hints = {key: kind for schema in schemas for key, kind in get_type_hints(schema).items()}
    defaults = defaults or {}
    fields = []
    for key, kind in hints.items():
        if dataclasses.is_dataclass(kind):
            nested = override_block(f"{name}{kind.__name__}", module, (kind,))
            fields.append((key, nested, field(default_factory=nested)))
        else:
            fields.append((key, Optional[kind], defaults.get(key)))
    cls = make_dataclass(name, [*own, *fields])
    cls.__module__ = module
    setattr(sys.modules[module], name, cls)
    return cls
