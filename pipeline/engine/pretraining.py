"""One pretraining harness for every family: its stage factory (`pretraining_stage`), the settings and the model a
family's task builds from the config, and the stage function (`pretrain`), which trains in this process with the
Lightning Trainer (pipeline/engine/lightning_loop.py) or spreads training over Ray Train workers
(pipeline/engine/workers.py: DDP, DeepSpeed, or the DeepSpeed CPU loop of pipeline/engine/deepspeed_loop.py). Training
checkpoints atomically and prunes (pipeline/engine/checkpoints.py), resumes exactly after a kill
(pipeline/engine/callbacks.py), fails a diverged run (pipeline/engine/divergence.py), validates, and writes the
encoder, the loss curve and the summary (pipeline/engine/pretraining_outputs.py). A family supplies only what differs,
as a `PretrainingTask` (pipeline/engine/pretraining_task.py).

Checkpoints go to `<out_dir>/checkpoints/` every `<settings>.checkpoint_every_steps`; a rerun of a crashed stage
re-enters the same directory (pipeline/engine/dag.py) and continues from the newest one: weights, optimizer, schedule,
data position, whatever state the family carries from batch to batch, and RNG, each rank its own, so the steps after
the resume are the steps an uninterrupted run would have taken.

`ckpt_path` (top-level) starts the stage trained with the `pretrain` settings from a given Lightning checkpoint, as a
resume does; a stage with checkpoints of its own resumes from those. The stage's cache key holds the file's content.

`<settings>.encoder_snapshots` (steps) also writes what the stage writes at the end into
`<out_dir>/encoder_snapshots/step-<N>/` as training passes each step N (pipeline/engine/snapshots.py): the encoders a
fine-tune stage compares to show what more pretraining buys downstream.
"""
from __future__ import annotations

import inspect
import json
from functools import partial, reduce
from typing import Callable, TypeVar, get_type_hints

import hydra
import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from conventions.piece_vectors import pieces_with_vectors
from pipeline.engine.checkpoints import start_checkpoint_fingerprint
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.distributed import DistributedSettings, run_on_ray_workers, stage_cpus, validate_distributed
from pipeline.engine.lightning_loop import train_with_lightning
from pipeline.engine.optim import freeze_rows
from pipeline.engine.pretraining_outputs import LOSS_CURVE, WORKER_SUMMARY
from pipeline.engine.pretraining_task import PretrainingTask
from pipeline.engine.settings import check_target_arguments, typed_settings
from pipeline.engine.snapshots import encoder_snapshot_steps
from pipeline.engine.tracking import log_curves
from pipeline.engine.workers import deepspeed_cpu_worker, lightning_worker
from pipeline.schema import FreezeEmbeddings, PretrainConfig

# What every pretraining stage depends on besides its family's settings: the model, the Trainer and its callbacks
# (which can change what training computes: EarlyStopping, StochasticWeightAveraging), the processes it is spread
# over, the run's seed and the checkpoint it starts from
HARNESS_CONFIG_KEYS = ("model", "trainer", "callbacks", "distributed", "seed", "ckpt_path")


def pretraining_stage(name: str, task: PretrainingTask,
                      upstream: tuple[str, ...] | Callable[[DictConfig], tuple[str, ...]],
                      config_keys: tuple[str, ...]) -> Stage:
    """A family's pretraining stage on this harness, reading the stages `upstream` names (a function of the config
    where that depends on it), depending on `config_keys` (its own settings) and HARNESS_CONFIG_KEYS."""
    return Stage(name, partial(pretrain, task=task), upstream, (*config_keys, *HARNESS_CONFIG_KEYS),
                 fingerprint=start_checkpoint_fingerprint, num_cpus=stage_cpus)


def _over(base: dict, top: dict) -> dict:
    """`base` with the keys `top` sets (not null) in its place, a nested block's key by key."""
    return {**base, **{k: _over(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                       for k, v in top.items() if v is not None}}


Settings = TypeVar("Settings", bound=PretrainConfig)


def merged_settings(cfg: DictConfig, blocks: tuple[str, ...], schema: type[Settings] = PretrainConfig) -> Settings:
    """The config blocks `blocks` (dotted keys) as one typed settings object of `schema`, a later block's keys over an
    earlier one's where it sets them (not null): pretrain_phase2 over pretrain, gpt.pretrain over pretrain
    (pipeline/schema.py override_block)."""
    merged = reduce(_over, [OmegaConf.to_container(OmegaConf.select(cfg, block), resolve=True)
                            for block in blocks])
    return typed_settings(OmegaConf.create(merged), schema)


def instantiate_model(cfg: DictConfig, key: str = "model", **config_values) -> nn.Module:
    """The Hydra model config at `key` built with `config_values` (what only the data knows, e.g. the vocabulary size)
    set in its `config`, from the run's seed: every rank starts from the same weights."""
    model_cfg = OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)
    model_cfg["config"].update(config_values)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    return hydra.utils.instantiate(model_cfg, _convert_="all")


def start_word_embeddings(word_embeddings: nn.Embedding, vectors: np.ndarray) -> int:
    """`word_embeddings` set to `vectors` (one row per token id, a piece-vector stage's table; NaN rows and rows past
    it keep their initialisation), rescaled to rows of unit length on average (standard deviation 1/sqrt(width)).
    BERT's and GPT's output layers are tied to this table: their logits are the rows' dot products with a LayerNormed
    state, and at the initialiser's scale (0.02, rows of length 0.23 at 128 dimensions) frozen vectors held BERT's
    held-out masked-LM loss at 6.66 nats against the unigram's 6.72 after 1,000 steps (docs/pretraining_recipes.md).
    Returns the rows set."""
    known = pieces_with_vectors(vectors)
    rows = torch.from_numpy(np.flatnonzero(known))
    values = torch.from_numpy(vectors[known])
    with torch.no_grad():
        word_embeddings.weight[rows] = values / values.std() / word_embeddings.embedding_dim ** 0.5
    return int(known.sum())


def keep_word_embeddings(word_embeddings: nn.Embedding, freeze: str, has_vector: np.ndarray | None) -> int:
    """Keep the rows of `word_embeddings` that `freeze` (FREEZE_EMBEDDINGS) names as they are, the others training:
    all, the whole table (requires_grad off); with_vector, the ids `has_vector` marks (a piece-vector stage's
    pieces_with_vectors: the rows start_word_embeddings set; None, or rows past it: none), by freeze_rows; none,
    nothing. The rows without a vector are pieces the corpus shows too rarely for skip-gram: frozen, they would stay
    at their random initialisation through pretraining and fine-tuning. Returns how many rows are kept."""
    weight = word_embeddings.weight
    if freeze == FreezeEmbeddings.all:
        weight.requires_grad_(False)
        return weight.shape[0]
    if freeze == FreezeEmbeddings.none:
        return 0
    rows = np.zeros(0, dtype=np.int64) if has_vector is None else np.flatnonzero(has_vector[:weight.shape[0]])
    freeze_rows(weight, torch.from_numpy(rows))
    return len(rows)


def start_piece_embeddings(table: nn.Embedding, settings: PretrainConfig,
                           read_vectors: Callable[[], np.ndarray]) -> None:
    """BERT's start (docs/pretraining_recipes.md) for a pretraining model whose pieces have one embedding table:
    `table` set to the piece vectors `read_vectors` gives (a piece-vector stage's table, read only where
    settings.init_embeddings is word2vec; a resumed run then loads its own checkpoint over them), then its rows kept
    as settings.freeze_embeddings names (with_vector: the rows that have a vector)."""
    vectors = read_vectors() if settings.init_embeddings == "word2vec" else None
    if vectors is not None:
        start_word_embeddings(table, vectors)
    has_vector = None if vectors is None else pieces_with_vectors(vectors)
    keep_word_embeddings(table, settings.freeze_embeddings, has_vector)


def check_model_config(cfg: DictConfig, key: str = "model") -> None:
    """Before any work: every key of `<key>.config` is a field of the config its `_target_` builds (models/: a function
    of a size name and `**overrides` returning a config dataclass), so a misspelt `+model.config.hiden_size=...`
    fails here, not when pretraining builds the model."""
    config = OmegaConf.select(cfg, f"{key}.config")
    target = hydra.utils.get_object(config._target_)
    built = get_type_hints(target).get("return")
    check_target_arguments(config, f"{key}.config", [target, built] if built else None)
    check_model_config_values(config, f"{key}.config", target)


def check_model_config_values(config: DictConfig, key: str, target: Callable) -> None:
    """Build `<key>` from the values a run knows before any work, those its stages set from the data (`???`: the
    vocabulary size) left at their defaults: a value the config refuses (`model.config.attention=bahdanau`, an unknown
    size name) fails here, with the config's own message, not when pretraining first builds the model. A target whose
    required arguments wait on the data is not built."""
    values = {name: value for name, value in OmegaConf.to_container(config, resolve=True).items()
              if not name.startswith("_") and not OmegaConf.is_missing(config, name)}
    required = [p.name for p in inspect.signature(target).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(name not in values for name in required):
        return
    try:
        target(**values)
    except (ValueError, KeyError) as err:
        raise ValueError(f"{key}: {err.args[0] if err.args else err}") from None


def pretrain(ctx: StageContext, task: PretrainingTask) -> dict:
    """The stage function of a pretraining stage: `partial(pretrain, task=...)`."""
    validate_distributed(ctx.cfg)
    p = task.settings(ctx.cfg)
    encoder_snapshot_steps(ctx.cfg, p, task.settings_key(ctx.cfg))
    settings = DistributedSettings.from_config(ctx.cfg, p)
    if not settings.uses_ray_train:
        return train_with_lightning(ctx, task, p, settings, rank=0, world_size=1)
    worker = deepspeed_cpu_worker if settings.deepspeed_on_cpu else lightning_worker
    (ctx.out_dir / WORKER_SUMMARY).unlink(missing_ok=True)
    run_on_ray_workers(worker, {"task": task, "cfg": OmegaConf.to_container(ctx.cfg, resolve=True, enum_to_str=True),
                                "name": ctx.name, "out_dir": str(ctx.out_dir),
                                "inputs": {k: str(v) for k, v in ctx.inputs.items()}},
                       settings, ctx.out_dir)
    log_curves(ctx.wandb_run, ctx.out_dir / LOSS_CURVE)
    return json.loads((ctx.out_dir / WORKER_SUMMARY).read_text())
