"""The root schema of `python -m pipeline`'s config, registered in Hydra's ConfigStore as `schema`, which
conf/config.yaml lists first among its defaults: every block typed (pipeline/schema.py), each family's own blocks, or
keys it adds to a shared block, from its record (Family.config), and enums of what the stage graph offers: stage names
(`pipeline.stages`), fine-tune model kinds (`finetune.models`), frozen encoders (`evaluate.encoders`). A typo in any
of them fails at composition, with Hydra's message naming the key.

Hydra adds a key to a typed block from the command line (`+task=cola`, `+pretrain.lrr=1e-3`) without a check, so
`check_declared_keys` refuses those before any work (pipeline/runner.py): no override is silently ignored.

Importing this module registers the schema: pipeline/runner.py does (and so `python -m pipeline`), as do the tests."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from pipeline.data_settings import DataConfig
from pipeline.downstream.finetune import MODEL_KINDS
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.word2vec import Word2VecConfig
from pipeline.engine.distributed import DistributedConfig
from pipeline.engine.settings import PathsConfig, RayConfig, did_you_mean
from pipeline.engine.training import TrainerConfig
from pipeline.evaluation.senteval import SentevalConfig
from pipeline.evaluation.settings import EvaluateConfig
from pipeline.evaluation.stage import ENCODERS
from pipeline.families import FAMILIES
from pipeline.schema import NULL_MEANS, OPEN_BLOCKS, ModelConfig, PretrainConfig, TargetConfig
from pipeline.stages import STAGES

StageName = StrEnum("StageName", {name: name for name in STAGES}, module=__name__)
# The kinds and encoders the families offer, narrowed here, where the root schema is built: the blocks' own schemas
# (pipeline/downstream/settings.py, pipeline/evaluation/settings.py) import no registry, as the families import them
FinetuneModel = StrEnum("FinetuneModel", {name: name for name in MODEL_KINDS}, module=__name__)
EncoderName = StrEnum("EncoderName", {name: name for name in ENCODERS}, module=__name__)


@dataclass
class PipelineConfig:
    # with the upstream stages they need
    stages: list[StageName] = field(default_factory=lambda: [StageName(name) for name in (
        "prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "finetune", "report")])
    until: Optional[StageName] = None  # stop after this stage (and what it needs)
    force: list[StageName] = field(default_factory=list)  # rerun these (and everything downstream) even if cached
    dry_run: bool = False  # print the DAG with cached/pending state, run nothing
    verify: bool = False  # hash every file of the cached stages again, not only those whose size or stat changed


@dataclass
class ReportConfig:
    """The report's own settings are its sections' (Family.report_section), which the families add."""


def _module_class(cls: type) -> type:
    """`cls`, made during import, findable by name in this module: what pickle needs to send a typed config to
    another process (a sweep's trial, a Ray task)."""
    cls.__module__, cls.__qualname__ = __name__, cls.__name__
    globals()[cls.__name__] = cls
    return cls


def _narrowed(schema: type, name: str, key: str, enum: type[StrEnum]) -> type:
    """`schema` with its list of names `key` typed as a list of `enum`, the default kept."""
    default = next(f for f in dataclasses.fields(schema) if f.name == key).default_factory
    return _module_class(make_dataclass(name, [(key, list[enum], field(default_factory=lambda: [
        enum(value) for value in default()]))], bases=(schema,)))


ENGINE_BLOCKS: dict[str, type] = {
    "paths": PathsConfig, "ray": RayConfig, "pipeline": PipelineConfig, "data": DataConfig,
    "pretrain": PretrainConfig, "finetune": _narrowed(FinetuneConfig, "FinetuneSchema", "models", FinetuneModel),
    "evaluate": _narrowed(EvaluateConfig, "EvaluateSchema", "encoders", EncoderName), "report": ReportConfig,
    "trainer": TrainerConfig, "distributed": DistributedConfig, "logger": TargetConfig, "model": ModelConfig,
    "senteval": SentevalConfig, "word2vec": Word2VecConfig,
}


def block_schemas() -> dict[str, type]:
    """Block name -> its schema: the engine's, each family's own, and a shared block with the keys families add to it
    (BERT's masked-LM settings in `pretrain`) as one dataclass."""
    parts = {name: [schema] for name, schema in ENGINE_BLOCKS.items()}
    for family in FAMILIES:
        for name, schema in family.config.items():
            parts.setdefault(name, []).append(schema)
    return {name: schemas[0] if len(schemas) == 1 else
            _module_class(make_dataclass(f"{name.title().replace('_', '')}Block", [], bases=tuple(schemas[::-1])))
            for name, schemas in parts.items()}


BLOCKS = block_schemas()
# The top-level settings: experiment_name (each experiment sets its own; outputs/<experiment_name>/), seed, and
# ckpt_path: a Lightning checkpoint (.ckpt) of a pretraining run that the run's pretraining starts from, continuing
# its steps, optimizer, schedule and data position (the stage trained with the `pretrain` settings; BERT's phase 2
# continues phase 1 as before). A stage that has checkpoints of its own, after a kill, resumes from those instead.
Config = _module_class(make_dataclass("Config", [
    ("experiment_name", str, "default"), ("seed", int, 12345), ("ckpt_path", Optional[str], None),
    ("callbacks", dict[str, Any], field(default_factory=dict)),
    *((name, schema, field(default_factory=schema)) for name, schema in BLOCKS.items())]))


def _schema_node() -> DictConfig:
    node = OmegaConf.structured(Config)
    for name in OPEN_BLOCKS:
        OmegaConf.set_struct(node[name], False)  # their targets' other arguments (e.g. +trainer.fast_dev_run=true)
    return node


ConfigStore.instance().store(name="schema", node=_schema_node())


def check_declared_keys(cfg: DictConfig) -> None:
    """Fail on a key that no schema declares: Hydra adds one from the command line (`+task=cola`) without a check,
    and nothing would read it. The open blocks take their targets' arguments (checked by pipeline/engine/settings.py);
    `pretrain_phase2` and other family blocks are typed like the rest."""
    def walk(node: DictConfig, path: str) -> None:
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema) or not OmegaConf.is_struct(node):
            return
        declared = [f.name for f in dataclasses.fields(schema)]
        for key in node:
            where = f"{path}{key}"
            if key not in declared:
                hint = did_you_mean(str(key), declared, path)
                raise ValueError(f"{where} is not a setting of this pipeline, so nothing would read it (an override "
                                 f"+{where}=... adds it unchecked); {hint}`python -m pipeline --cfg job` lists the "
                                 "settings")
            if not (OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key)) and \
                    isinstance(node[key], DictConfig):
                walk(node[key], f"{where}.")

    walk(cfg, "")


def null_standins(schema: type | None = None, path: str = "") -> dict[str, str]:
    """Dotted key of each block a run may leave null -> the block that stands in for it then (field metadata
    NULL_MEANS: gpt.model -> model)."""
    schema = schema or Config
    found = {}
    hints = get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if NULL_MEANS in f.metadata:
            found[f"{path}{f.name}"] = f.metadata[NULL_MEANS]
        elif dataclasses.is_dataclass(hints[f.name]):
            found.update(null_standins(hints[f.name], f"{path}{f.name}."))
    return found


def map_keys(schema: type | None = None, prefix: str = "") -> list[str]:
    """The dotted keys of the schema's maps of names (`dict[str, ...]` fields: senteval.tasks, callbacks)."""
    found = []
    for name, kind in get_type_hints(schema or Config).items():
        if getattr(kind, "__origin__", None) is dict:
            found.append(f"{prefix}{name}")
        elif dataclasses.is_dataclass(kind):
            found += map_keys(kind, f"{prefix}{name}.")
    return found


# Names an earlier version used, -> what they are now: BERT's stages and fine-tune kinds carry the family's name, as
# every other family's do. An old name fails before composition with the new one (`check_renamed_names`).
RENAMED_STAGES = {"tokenizer": "bert_tokenizer", "examples": "bert_examples", "examples_phase2": "bert_examples_phase2",
                  "pretrain": "bert_pretrain", "pretrain_phase2": "bert_pretrain_phase2",
                  "piece_vectors": "bert_piece_vectors"}
RENAMED_KINDS = {"pretrained": "bert", "random_init": "bert_random", "external": "bert_external"}
RENAMED = {"pipeline.stages": ("stage", RENAMED_STAGES), "pipeline.until": ("stage", RENAMED_STAGES),
           "pipeline.force": ("stage", RENAMED_STAGES), "finetune.models": ("finetune.models kind", RENAMED_KINDS)}


def check_renamed_names(overrides: list[str]) -> None:
    """Refuse an old stage or fine-tune kind name, or an old setting or value, on the command line, naming the new
    one: Hydra's own message ("Invalid value 'pretrain', expected one of [...]") lists every name without saying which
    one was meant."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.split(".")[-2:] == ["config", "fast_kernels"]:  # model.config.* or gpt.model.config.*
            raise SystemExit(f"error: {override}: the kernels are no longer a model setting saved with the weights but "
                             f"one of the run, applied where the pipeline builds a model; write "
                             f"trainer.fast_kernels={value}")
        if key.split(".")[-1] == "whole_word_masking":  # pretrain.* or pretrain_phase2.*
            masking = "whole_word" if value.strip().lower() == "true" else "token"
            raise SystemExit(f"error: {override}: whole-word masking is now one value of the masking unit, beside "
                             f"token and SpanBERT's span; write {key.rpartition('.')[0]}.masking={masking}")
        if key.split(".")[-1] == "freeze_embeddings" and value.strip().lower() in ("true", "false"):
            rows = "all" if value.strip().lower() == "true" else "none"
            raise SystemExit(f"error: {override}: freeze_embeddings now names the rows it keeps: all (as true), "
                             f"with_vector (those started from a piece vector; the others train) or none (as false); "
                             f"write {key}={rows}")
        if key not in RENAMED:
            continue
        what, renamed = RENAMED[key]
        names = [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",")]
        old = [name for name in names if name in renamed]
        if old:
            now = "[" * ("[" in value) + ",".join(renamed.get(n, n) for n in names) + "]" * ("[" in value)
            raise SystemExit(f"error: {override}: " + "; ".join(f"{what} {n!r} is now {renamed[n]!r}" for n in old)
                             + f"; write {key}={now} (BERT's names carry the family's, as every family's do)")


def check_whole_map_overrides(overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> None:
    """Refuse `senteval.tasks={SUBJ: {...}}`, naming the overrides that do what it means: Hydra merges a whole map
    given on the command line into the names already there instead of replacing them, and refuses a new name in it
    ("Key 'SUBJ' is not in struct"), so it either fails with that or silently keeps the other names."""
    maps = map_keys()
    for override in overrides:
        key, _, value = override.partition("=")
        if key not in maps or not value.lstrip().startswith("{"):
            continue
        try:
            names = list(OmegaConf.select(compose([o for o in overrides if o != override]), key) or {})
        except Exception:  # noqa: BLE001 -- Hydra reports the other overrides' errors itself
            return
        drop = " ".join(f"~{key}.{name}" for name in names)
        raise SystemExit(f"error: {override}: {key} is a map of names, and an override of the whole map would merge "
                         f"into the names it has ({', '.join(names) or 'none'}) rather than replace them, and cannot "
                         f"add a name; drop names with ~{key}.NAME and add one with +{key}.NAME='{{...}}', e.g. to "
                         f"have only the names you give: {drop} +{key}.NAME='{{...}}'")


def check_overrides_into_null_blocks(overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> None:
    """Refuse `gpt.model.config.n_layer=4` where gpt.model is null, naming the block to override instead: Hydra sets a
    key inside a null block with an OmegaConf assertion ("Unexpected type: None") and a traceback. `compose` builds
    the config from overrides; it runs only when an override reaches into a block that may be null."""
    standins = null_standins()
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        block = next((b for b in standins if key.startswith(f"{b}.")), None)
        if block is None or override.startswith("+") and not override.startswith("++"):
            continue
        others = [o for o in overrides if o != override]
        try:
            cfg = compose(others)
        except Exception:  # noqa: BLE001 -- Hydra reports the other overrides' errors itself
            return
        if OmegaConf.select(cfg, block) is None:
            instead = f"{standins[block]}{key[len(block):]}={value}"
            raise SystemExit(f"error: {override}: {block} is null in this run, so {standins[block]} stands in for it; "
                             f"override {instead} instead")
