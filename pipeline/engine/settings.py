"""The engine's own blocks (paths, ray), typed; `typed_settings`, which makes any block its schema's object where a
stage begins; and start-up checks of settings the config schema cannot type: numeric ranges, declared on the schema's
fields beside their type and default (`ranged`) and checked over every block of the composed config
(`check_ranges`), and the arguments of a block built by `_target_`. No torch: the data stages' Ray workers load this
module."""
from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, get_origin, get_type_hints

import hydra
from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Number:
    """What a numeric setting must be. Checked at start-up: a bad number otherwise surfaced in a later stage (hours
    in, after pretraining), with a message that did not name the setting, or hung (ray.num_cpus=0)."""
    kind: type                 # int: a whole number; float: any number
    low: float
    high: float | None = None
    low_open: bool = False     # `low` itself is excluded
    high_open: bool = False    # `high` itself is excluded
    nullable: bool = False
    unless: str | None = None  # not checked when this setting is set
    why: str = ""              # what the bound is, where the number alone would puzzle

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        return ((value > self.low if self.low_open else value >= self.low)
                and (self.high is None or (value < self.high if self.high_open else value <= self.high)))

    def describe(self) -> str:
        upper = "" if self.high is None else f" and {'<' if self.high_open else '<='} {self.high:g}"
        return (f"{'an integer' if self.kind is int else 'a number'} {'>' if self.low_open else '>='} {self.low:g}"
                f"{upper}{' or null' if self.nullable else ''}{f' ({self.why})' if self.why else ''}")


RANGE = "range"  # field metadata: the Number a numeric setting must be, checked at start-up (check_ranges)
# field metadata of a key of an override block (pipeline/schema.py override_block: gpt.pretrain, pretrain_phase2):
# null keeps the value of the block it overrides, whose range then holds; a value it sets is checked against it
NULL_KEEPS = "null_keeps"


def ranged(default: Any, number: Number) -> Any:
    """A schema field with its default and the range `number` its values must be in: the one place the setting's type,
    default, range and reason are stated, checked for every block of that schema (check_ranges)."""
    return field(default=default, metadata={RANGE: number})


POSITIVE_INT, COUNT = Number(int, 1), Number(int, 0)
RATE, FRACTION = Number(float, 0, low_open=True), Number(float, 0, 1)


@dataclass
class PathsConfig:
    # Stage outputs (content-addressed, shared by all runs) and downloaded default data; never inside a run directory,
    # so a new run of the same experiment reuses finished stages.
    cache_dir: str = "${oc.env:TEXTREP_CACHE_DIR,${oc.env:HOME}/.cache/textrep}"
    run_dir: str = "${hydra:runtime.output_dir}"


@dataclass
class RayConfig:
    num_cpus: int = ranged(2, Number(int, 1, unless="ray.address"))  # a cluster owns its resources (README)
    address: Optional[str] = None  # null: start a local Ray; "auto" or "ray://host:port" joins a cluster


def all_cpus(cfg: DictConfig) -> float:
    """A training stage's reservation: every CPU the run was given, for its torch threads."""
    return float(typed_settings(cfg.ray, RayConfig).num_cpus)



T = TypeVar("T")


def typed_settings(block: DictConfig, schema: type[T]) -> T:
    """A config block as its typed settings object, made where a stage (its cache key, a start-up check) begins and
    passed on from there: types and enums as `schema` declares them, attributes instead of string keys. Keys of
    the block that `schema` does not declare (those a family adds to a shared block) are for their own schema."""
    names = {entry.name for entry in dataclasses.fields(schema)}
    settings = OmegaConf.merge(OmegaConf.structured(schema),
                               {key: value for key, value in block.items() if key in names})
    # A map the block states is the whole map, not added to the schema's default one: merging would bring back the
    # entries the run removed (`~senteval.tasks.MRPC`).
    for name, hint in get_type_hints(schema).items():
        if name in block and get_origin(hint) is dict:
            settings[name] = block[name]
    return OmegaConf.to_object(settings)


def cache_dir_of(cfg: DictConfig) -> str:
    """paths.cache_dir: where stage outputs, downloaded data and file digests live, shared by every run. Read alone,
    not as the whole PathsConfig: paths.run_dir interpolates Hydra's runtime, which exists only in a Hydra app's
    driver (not in a composed config's tests, nor where a config is planned without a run directory)."""
    return str(cfg.paths.cache_dir)


def stages_in_run(cfg: DictConfig) -> tuple[str, ...]:
    """pipeline.stages as plain names, what a stage's upstream, a start-up check or a report section asks about the
    run, read alone: a config made for one stage (a test's, a report's) need not plan a run."""
    return tuple(map(str, cfg.pipeline.stages))


@dataclass(frozen=True)
class StageSelection:
    """The `pipeline` block as the engine reads it, once, where a run is planned: stage names as plain strings. The
    block's schema (pipeline/config.py's PipelineConfig, with its defaults) types them as the registered stages' enum,
    which needs every family's stages imported, torch with them; the engine also plans graphs of its own (tests)."""
    stages: tuple[str, ...]     # asked for; their upstream stages come with them
    until: str | None           # stop after this stage (and what it needs)
    force: tuple[str, ...]      # rerun these and everything downstream
    dry_run: bool
    verify: bool

    @classmethod
    def of(cls, cfg: DictConfig) -> StageSelection:
        p = cfg.pipeline
        return cls(stages_in_run(cfg), str(p.until) if p.until else None, tuple(map(str, p.force or ())),
                   bool(p.get("dry_run")), bool(p.get("verify")))


def check_ranges(cfg: DictConfig, schema: type, prefix: str = "") -> None:
    """Every numeric setting of `cfg` under `prefix` in the range its field in `schema` declares (`ranged`), through
    the nested blocks the schema types (gpt.pretrain): a bad number fails before any work, naming its key, where it
    otherwise surfaced hours in (in pretraining, after it), with a message that did not name the setting, or hung
    (ray.num_cpus=0). A block the schema has and `cfg` lacks (a test's config for one stage) is not checked."""
    hints = get_type_hints(schema)
    for entry in dataclasses.fields(schema):
        key = f"{prefix}{entry.name}"
        number = entry.metadata.get(RANGE)
        if number is None:
            if dataclasses.is_dataclass(hints[entry.name]) and OmegaConf.select(cfg, key) is not None:
                check_ranges(cfg, hints[entry.name], f"{key}.")
            continue
        value = OmegaConf.select(cfg, key)
        if value is None and entry.metadata.get(NULL_KEEPS) or number.unless and OmegaConf.select(cfg, number.unless):
            continue
        if not number.accepts(value):
            raise ValueError(f"{key}={value!r}: expected {number.describe()}; set {key} on the command line "
                             "or in the experiment's config")


def did_you_mean(name: str, choices: list[str], prefix: str = "") -> str:
    """"did you mean <prefix><closest choice>? " for a misspelt `name`, or "" when no choice is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean {prefix}{close[0]}? " if close else ""


def check_target_arguments(node: DictConfig, key: str, accepting: list | None = None) -> None:
    """Every key of `node`, a block built by its `_target_`, is an argument of that class or function (or of one of
    `accepting`, where the target passes its other keywords on): a misspelt one fails before any work, not when a
    stage first builds the object, or never, where nothing builds it."""
    names: list[str] = []
    for target in accepting or [hydra.utils.get_object(node._target_)]:
        parameters = inspect.signature(target).parameters.values()
        if not accepting and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        names += [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]
    for name in node:
        if not name.startswith("_") and name not in names:
            hint = did_you_mean(name, names, f"{key}.")
            raise ValueError(f"{key}.{name}: {node._target_} takes no argument {name!r}; {hint}its arguments: "
                             f"{', '.join(dict.fromkeys(names))}")


def model_key(cfg: DictConfig, family: str) -> str:
    """The config block of a family's model: `<family>.model` where the run gives the family one of its own (a run
    that pretrains two families, whose shared `model` can hold only one: experiment=bert_vs_gpt), else `model`."""
    own = f"{family}.model"
    return own if OmegaConf.select(cfg, own) is not None else "model"
