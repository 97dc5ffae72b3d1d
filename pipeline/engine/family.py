"""What a model family offers the pipeline: one record per family (pipeline/<family>/family.py), listed once in
pipeline/families.py. The stage graph, `evaluate`, `finetune`, `report`, `python -m pipeline.export` and
`python -m pipeline.generate`, and the tests' tiny runs (tests/helpers.py) read these records and never name a family.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import numpy as np
from omegaconf import DictConfig
from torch import nn

from pipeline.engine.dag import Stage, StageContext

Upstream = Callable[[DictConfig], tuple[str, ...]]  # the stages a consumer reads, given the run's config

STRATEGIES = ("greedy", "sample", "beam")


@dataclass(frozen=True)
class Request:
    """What `python -m pipeline.generate` asks of a family's model: the decoding strategy and its settings (defined
    here, beside Generation, so that the record's module loads no model code: every stage's fingerprint reads it)."""
    strategy: str = "greedy"
    max_new_tokens: int = 50
    beams: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@runtime_checkable
class Encoder(Protocol):
    """A frozen sentence encoder in SentEval's prepare/batcher interface; the contract is in
    pipeline/evaluation/senteval.py's docstring."""

    name: str

    def prepare(self, samples: list[list[str]]) -> None: ...

    def batcher(self, batch: list[list[str]]) -> np.ndarray: ...


@dataclass(frozen=True)
class EncoderSpec:
    """A frozen encoder the evaluate stage can probe: the stages it reads and how to build it in that stage."""
    upstream: Upstream
    build: Callable[[StageContext], Encoder]
    # the same architecture randomly initialised (evaluate.encoders name): the report states what pretraining gave
    # over it (Wieting & Kiela 2019: random encoders are strong probing baselines)
    random_twin: str | None = None


@dataclass(frozen=True)
class TokenCoverage:
    """How much of a task a model kind's inputs cover (TaskModels.token_coverage), for its rows and the report."""
    unknown_token: str    # its tokenizer's unknown token, as the report names it ("[UNK]")
    unknown_rate: float   # the share of the task's tokens, as the model reads them, that are that token
    # where the kind's word embeddings start from pretrained vectors: what those are, as the report names them
    # ("piece vectors"), and the share of the task's tokens that have one (the others start from random rows)
    vectors: str | None = None
    vector_coverage: float | None = None


class TaskModels(Protocol):
    """One fine-tune model kind, loaded once per finetune stage: it encodes a task for its inputs and builds a fresh
    model (encoder + task head) for every (task, train size, seed). A kind with a tokenizer may also offer
    `token_coverage(data) -> TokenCoverage` of a task it encoded: the finetune stage records it beside the kind's rows
    and warns where the tokenizer or the vectors its embeddings start from miss much of the task. One whose word
    embeddings start from piece vectors has `pieces_with_vectors` (a bool per token id, or None): the rows
    finetune.freeze_embeddings=with_vector keeps."""
    encoding_key: str  # kinds with the same key read the same inputs (tokenizer): the task is encoded once for them

    # finetune: the stage's typed settings (pipeline.downstream.finetune.FinetuneConfig)
    def encode(self, task: DictConfig, data_dir: Path, finetune, seed: int,
               selection_fraction: float | None): ...   # -> pipeline.downstream.task_data.TaskData

    def build(self, data) -> nn.Module: ...


@dataclass(frozen=True)
class FinetuneKind:
    """A value of `finetune.models`: the stages it reads and how the finetune stage loads it (reading the keys its
    family adds to `finetune` through its own schema)."""
    upstream: Upstream
    load: Callable[[StageContext], TaskModels]
    fingerprint: Callable[[DictConfig], str] = lambda cfg: ""  # identity of files it reads outside the cache
    # The pretraining stage whose output `load` reads the encoder from. Where that stage wrote encoder snapshots
    # (pipeline/engine/snapshots.py), the kind is fine-tuned from each too, loaded by `load` with the snapshot's
    # directory in that stage's place.
    pretraining_stage: Callable[[DictConfig], str] | None = None
    # the kind that fine-tunes the same architecture from random initialisation: the report states what pretraining
    # gained over it
    random_twin: str | None = None
    # The kind that is this one's control in a run of cfg: the same architecture from the same start as its
    # pretraining (BERT's piece vectors under random layers), fine-tuned by the same recipe, with no pretraining
    # steps. The gain over the random twin is what the start and the pretraining bought together, the gain over the
    # control what pretraining itself bought. Where pretraining starts from random initialisation the control is the
    # random twin, named here too; None: the run has none (a start no kind reproduces, such as a checkpoint's).
    control: Callable[[DictConfig], str | None] = lambda cfg: None
    # For a kind that is a control (bert_w2v, gpt_w2v): the kind whose control it is, in a run whose `control` names it;
    # a run where it does not is refused before any stage (pipeline.downstream.finetune.check_controls)
    control_of: str | None = None


@dataclass(frozen=True)
class Generation:
    """Text from the family's pretrained model, as `python -m pipeline.generate` writes it."""
    stage: str       # the pretraining stage whose `model/` writes text
    experiment: str  # an experiment that runs it, named to a user whose run has none
    # (model directory, the texts, request, fast_kernels) -> each text's outputs, best first (one, or the beams' best);
    # ValueError, one line, for a text it cannot generate from
    write: Callable[[Path, list[str], Request, bool], list[list[str]]]
    continues: bool = False  # the outputs continue the text (a language model's): printed after it


@dataclass(frozen=True)
class Tiny:
    """The family at the tests' size (tests/helpers.py family_config): an experiment that runs it, the stages its first
    pretraining stage reads, in order, and the overrides that shrink it to seconds on the tests' tiny corpus."""
    experiment: str
    data_stages: tuple[str, ...]
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    name: str
    stages: tuple[Stage, ...]
    # the stages whose loss curves and learning summary the report shows (each writes loss_curve.csv, stage.json)
    pretraining_stages: tuple[str, ...]
    encoders: dict[str, EncoderSpec] = field(default_factory=dict)        # evaluate.encoders names it offers
    finetune_kinds: dict[str, FinetuneKind] = field(default_factory=dict)  # finetune.models names it offers
    # extra report sections: the stages they read, and a function (cfg, stage dirs, out dir, figures) -> markdown
    # lines, recording every figure it draws in `figures`
    report_upstream: Upstream = lambda cfg: ()
    report_section: Callable[[DictConfig, dict[str, Path], Path, dict[str, Path]], list[str]] | None = None
    # settings that cannot work in a run of these stages (pipeline.stages and those they need): raise before any stage
    validate: Callable[[DictConfig, list[str]], None] = lambda cfg, stages: None
    # the schemas (dataclasses) of its config blocks: block name -> the keys it reads there, typed; a block the engine
    # has (pretrain) gets them added (pipeline/config.py)
    config: dict[str, type] = field(default_factory=dict)
    # `python -m pipeline.export`: the model card's account of a final model, given the config.json its pretraining
    # stage wrote into hf/ (every stage of pretraining_stages writes one); None: the family's models cannot be
    # exported, and `not_exportable` says why
    describe_export: Callable[[dict], str] | None = None
    not_exportable: str = "its pretraining stages write no HuggingFace directory (hf/)"
    generation: Generation | None = None  # None: its models write no text
    tiny: Tiny | None = None  # None: the tests run none of its stages
