"""One pretraining harness for every family: it builds the Lightning Trainer (one process, or DDP in Ray Train
workers) or the DeepSpeed CPU loop (pipeline/engine/distributed.py), checkpoints atomically and prunes, resumes
exactly after a kill, fails a diverged run (pipeline/engine/divergence.py), validates, and writes the encoder, the
loss curve and the summary. A family supplies only what differs, as a `PretrainingTask`.

Checkpoints go to `<out_dir>/checkpoints/` every `<settings>.checkpoint_every_steps`; a rerun of a crashed stage
re-enters the same directory (pipeline/engine/dag.py) and continues from the newest one: weights, optimizer, schedule,
data position, whatever state the family carries from batch to batch, and RNG, each rank its own, so the steps after
the resume are the steps an uninterrupted run would have taken.

`ckpt_path` (top-level) starts the stage trained with the `pretrain` settings from a given Lightning checkpoint, as a
resume does; a stage with checkpoints of its own resumes from those. The stage's cache key holds the file's content.

`<settings>.encoder_snapshots` (steps) also writes what the stage writes at the end into
`<out_dir>/encoder_snapshots/step-<N>/` as training passes each step N (`EncoderSnapshots`): the encoders a
fine-tune stage compares to show what more pretraining buys downstream.
"""
from __future__ import annotations

import errno
import inspect
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, replace
from functools import partial, reduce
from pathlib import Path
from typing import Callable, Iterable, Protocol, TypeVar, get_type_hints

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from data_prep.corpus.shards import write_json_atomically
from pipeline.engine.dag import MARKER, Stage, StageContext
from pipeline.engine.distributed import (
    DistributedSettings,
    checkpoint_tags,
    consolidated_state_dict,
    deepspeed_config,
    gather_from_ranks,
    lightning_strategy,
    run_on_ray_workers,
    stage_cpus,
    this_ranks_state,
    train_deepspeed,
    use_deepspeed_cpu_accelerator,
    validate_distributed,
    whole_parameters,
)
from pipeline.engine.divergence import DivergenceMonitor, reduce_mean
from pipeline.engine.fingerprints import memoised_digests
from pipeline.engine.module import PretrainModule, pretraining_advice
from pipeline.engine.optim import sparse_gradient_parameters, use_dense_gradients
from pipeline.engine.settings import cache_dir_of, check_target_arguments, typed_settings
from pipeline.engine.tracking import log_curves
from pipeline.engine.training import (
    PROGRESS_EVERY_N_STEPS,
    RELEASE_EVERY_N_BATCHES,
    LossHistory,
    TrainerConfig,
    compile_network,
    keep_freed_memory_for_reuse,
    make_trainer,
    progress_line,
    release_freed_memory,
    resolve_precision,
    with_fast_kernels,
)
from pipeline.schema import PretrainConfig

CHECKPOINT_DIR = "checkpoints"
KEEP_CHECKPOINTS = 2
LOSS_CURVE = "loss_curve.csv"
SNAPSHOT_DIR = "encoder_snapshots"
WORKER_SUMMARY = "train_summary.json"  # how rank 0 of the Ray Train workers hands the stage its summary
# What every pretraining stage depends on besides its family's settings: the model, the Trainer and its callbacks
# (which can change what training computes: EarlyStopping, StochasticWeightAveraging), the processes it is spread
# over, the run's seed and the checkpoint it starts from
HARNESS_CONFIG_KEYS = ("model", "trainer", "callbacks", "distributed", "seed", "ckpt_path")
STARTS_FROM_CKPT_PATH = "pretrain"  # the settings block of the training that ckpt_path starts
# DeepSpeed's ZeRO stages leave sparse gradients out of their reduction buckets (split_half_float_double in
# deepspeed/runtime/zero/stage_1_and_2.py; its `sparse_gradients` option is for training without ZeRO), so each rank
# would step with its own
DEEPSPEED_DENSE = "DeepSpeed's ZeRO cannot reduce sparse ones"


class DataPosition(Protocol):
    """Where a rank's training data stands, saved in every checkpoint (SeededBatchSampler is one)."""

    def state_dict(self, batches_consumed: int) -> dict: ...  # after `batches_consumed` batches of this epoch

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class PretrainingData:
    """One rank's data. A pass over `train_loader` is an epoch; its sampler's `set_epoch` is called before each."""
    train_loader: Iterable[dict]
    position: DataPosition
    val_loader: Iterable[dict]  # held-out batches (a DataLoader), the same on every rank
    batch_size: int             # rows of one rank's batch
    uniform_loss: float         # held-out loss of a uniform guess over the model's outputs (engine/divergence.py)


@dataclass
class TrainingRun:
    """What the harness knows once training is over, for a family's summary."""
    steps: int
    steps_run: int  # in this process, after any resume
    seconds: float
    world_size: int
    accumulate_grad_batches: int
    history: LossHistory

    @property
    def batches_per_s(self) -> float:
        """Batches of all ranks together per second of this process's training."""
        return self.steps_run * self.accumulate_grad_batches * self.world_size / max(self.seconds, 1e-9)

    def rows_seen(self, batch_size: int) -> int:
        """The training rows (instances, blocks, windows, triples) of all steps, every rank's every micro-batch of
        `batch_size` rows: what a model card counts its tokens from."""
        return self.steps * self.accumulate_grad_batches * self.world_size * batch_size


class PretrainingTask(Protocol):
    """What a family supplies: its module (a PretrainModule, pipeline/engine/module.py: the family's loss, the engine's
    optimizer, checks and logging, whichever loop trains it), its data, and what it writes and sums up."""
    def settings_key(self, cfg: DictConfig) -> str: ...  # the config block of the settings below, named in messages

    # max_steps, grad_clip, val_every_steps, ...: the schema's typed object (typed_settings, merged_settings)
    def settings(self, cfg: DictConfig) -> PretrainConfig: ...

    # The hooks below get `settings`, what `settings` above gave once where the stage (or a Ray Train worker) began.
    # seeded: the same weights on every rank; built with OptimizerSettings.of(settings, settings_key)
    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> PretrainModule: ...

    def data(self, ctx: StageContext, module: PretrainModule, settings: PretrainConfig, rank: int,
             world_size: int) -> PretrainingData: ...

    def write(self, ctx: StageContext, module: PretrainModule) -> None: ...  # what later stages read, in out_dir

    def summary(self, module: PretrainModule, data: PretrainingData, run: TrainingRun) -> dict: ...


def built_module(task: PretrainingTask, ctx: StageContext, p: PretrainConfig) -> PretrainModule:
    """The family's module (task.build_module), with the run's kernels (trainer.fast_kernels) applied from outside:
    every module the harness trains or validates is built here, whichever family."""
    return with_fast_kernels(task.build_module(ctx, p), ctx.cfg)


def pretraining_stage(name: str, task: PretrainingTask,
                      upstream: tuple[str, ...] | Callable[[DictConfig], tuple[str, ...]],
                      config_keys: tuple[str, ...]) -> Stage:
    """A family's pretraining stage on this harness, reading the stages `upstream` names (a function of the config
    where that depends on it), depending on `config_keys` (its own settings) and HARNESS_CONFIG_KEYS."""
    return Stage(name, partial(pretrain, task=task), upstream, (*config_keys, *HARNESS_CONFIG_KEYS),
                 fingerprint=start_checkpoint_fingerprint, num_cpus=stage_cpus)


def start_checkpoint_fingerprint(cfg: DictConfig) -> str:
    """The content of the checkpoint `ckpt_path` names (memoised by the file's identity): new weights at the same
    path are new work."""
    if not cfg.ckpt_path:
        return ""
    path = Path(cfg.ckpt_path).expanduser().resolve()
    return memoised_digests([path], cache_dir_of(cfg), str(path))[0]


def check_start_checkpoint(cfg: DictConfig) -> None:
    if cfg.ckpt_path and not Path(cfg.ckpt_path).expanduser().is_file():
        raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path} is not a file; point it at a Lightning checkpoint (.ckpt, "
                                "e.g. a pretraining stage's checkpoints/step-*.ckpt), or leave it null")


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


def model_key(cfg: DictConfig, family: str) -> str:
    """The config block of a family's model: `<family>.model` where the run gives the family one of its own (a run
    that pretrains two families, whose shared `model` can hold only one: experiment=bert_vs_gpt), else `model`."""
    own = f"{family}.model"
    return own if OmegaConf.select(cfg, own) is not None else "model"


def instantiate_model(cfg: DictConfig, key: str = "model", **config_values) -> nn.Module:
    """The Hydra model config at `key` built with `config_values` (what only the data knows, e.g. the vocabulary size)
    set in its `config`, from the run's seed: every rank starts from the same weights."""
    model_cfg = OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)
    model_cfg["config"].update(config_values)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    return hydra.utils.instantiate(model_cfg, _convert_="all")


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


def encoder_snapshot_steps(cfg: DictConfig, settings: PretrainConfig, key: str) -> list[int]:
    """`<key>.encoder_snapshots` (a list of whole numbers: the schema's), in order: each a step the run takes,
    refused before any work otherwise."""
    steps = list(settings.encoder_snapshots)
    bad = [s for s in steps if not 0 < s <= settings.max_steps]
    if bad:
        raise ValueError(f"{key}.encoder_snapshots={steps}: {bad} not a step of the run; each must be a whole number "
                         f"from 1 to {key}.max_steps={settings.max_steps}")
    if steps and DistributedSettings.from_config(cfg, settings).strategy == "deepspeed":
        raise ValueError(f"{key}.encoder_snapshots={steps}: under DeepSpeed the encoder is written once, from the "
                         "ZeRO partitions of the last checkpoint; pretrain with trainer=cpu or trainer=ddp_cpu to "
                         f"keep snapshots, or set {key}.encoder_snapshots=[]")
    return sorted(set(steps))


def snapshot_dir(stage_dir: Path, step: int) -> Path:
    return stage_dir / SNAPSHOT_DIR / f"step-{step}"


def encoder_snapshots(stage_dir: Path) -> dict[int, Path]:
    """step -> directory of each snapshot a pretraining stage wrote (laid out as the stage's own output), in order."""
    found = {int(p.name.removeprefix("step-")): p for p in (stage_dir / SNAPSHOT_DIR).glob("step-*")}
    return dict(sorted(found.items()))


def steps_trained(stage_dir: Path) -> int:
    """The steps a finished pretraining stage took: what its own output (the final encoder) has seen."""
    return int(json.loads((stage_dir / MARKER).read_text())["steps"])


def pretrain(ctx: StageContext, task: PretrainingTask) -> dict:
    """The stage function of a pretraining stage: `partial(pretrain, task=...)`."""
    validate_distributed(ctx.cfg)
    p = task.settings(ctx.cfg)
    encoder_snapshot_steps(ctx.cfg, p, task.settings_key(ctx.cfg))
    settings = DistributedSettings.from_config(ctx.cfg, p)
    if not settings.uses_ray_train:
        return _train_with_lightning(ctx, task, p, settings, rank=0, world_size=1)
    worker = _deepspeed_cpu_worker if settings.deepspeed_on_cpu else _lightning_worker
    (ctx.out_dir / WORKER_SUMMARY).unlink(missing_ok=True)
    run_on_ray_workers(worker, {"task": task, "cfg": OmegaConf.to_container(ctx.cfg, resolve=True, enum_to_str=True),
                                "name": ctx.name, "out_dir": str(ctx.out_dir),
                                "inputs": {k: str(v) for k, v in ctx.inputs.items()}},
                       settings, ctx.out_dir)
    log_curves(ctx.wandb_run, ctx.out_dir / LOSS_CURVE)
    return json.loads((ctx.out_dir / WORKER_SUMMARY).read_text())


# Less than this left on a checkpoint's disk when its save failed: the disk was full.
_FULL_BYTES = 1 << 20


class AtomicCheckpointIO(TorchCheckpointIO):
    """A checkpoint appears under its name only once fully written, and only the newest `keep` stay.

    A kill mid-save leaves the previous checkpoints intact. Pruning lives here rather than in ModelCheckpoint's
    top-k, which forgets the checkpoints of the run before a resume."""

    def __init__(self, keep: int):
        super().__init__()
        self.keep = keep

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            # Measured before the temporary file gives its space back. A failed save used to leave it: 7.6 MB on a
            # 20 MiB volume, and every rerun added another, so that a rerun which would fit failed again.
            free = shutil.disk_usage(path.parent).free
            written = tmp.stat().st_size if tmp.exists() else 0
            tmp.unlink(missing_ok=True)
            if free < _FULL_BYTES and not (isinstance(err, OSError) and err.errno == errno.ENOSPC):
                # torch.save reports a full disk as "RuntimeError: [enforce fail at inline_container.cc] unexpected
                # pos": said as the full disk it is, the stage's error names paths.cache_dir (engine/dag.py)
                raise OSError(errno.ENOSPC, f"no space left on device for checkpoint {path} ({written / 1e6:.1f} MB "
                                            f"written, {free / 1e6:.2f} MB free): {err}") from err
            raise
        for old in sorted(path.parent.glob("step-*.ckpt"))[:-self.keep]:  # zero-padded: name order is step order
            old.unlink()


class CheckpointAfterValidation(ModelCheckpoint):
    """ModelCheckpoint every n training steps, where a step that also validates is saved once that validation has run
    (Lightning's own deferral, which it uses for a monitored metric). Saved before it, as Lightning orders the two, a
    checkpoint lacked its step's held-out point, and a run resumed from it had none at the step it resumed at. A
    kill during the validation leaves the checkpoint before, from which the step and its validation are done
    again."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if (self._every_n_train_steps >= 1 and step % self._every_n_train_steps == 0
                and not self._should_skip_saving_checkpoint(trainer)
                # the test Lightning makes right after this hook
                and trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)):
            self._defer_save_until_validation = True
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class TrainingPosition(L.Callback):
    """Saves and restores what Lightning's checkpoint leaves out: every rank's data position and torch RNG.

    The position is the batches the trainer has processed this epoch, not what the sampler has handed out:
    DataLoader workers and Lightning's fetcher read ahead of the training step."""

    def __init__(self, position: DataPosition):
        self.position = position

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict:
        processed = self._trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"ranks": gather_from_ranks({"data": self.position.state_dict(processed),
                                            "rng": torch.get_rng_state()})}

    def load_state_dict(self, state: dict) -> None:
        own = this_ranks_state(state["ranks"])
        self.position.load_state_dict(own["data"])
        torch.set_rng_state(own["rng"])


class EncoderSnapshots(L.Callback):
    """Writes what the stage writes at the end (the task's `write`) into encoder_snapshots/step-<N>/ when training
    reaches step N, before that step's checkpoint (Lightning runs ModelCheckpoint last): a run resumed from a
    checkpoint already has the snapshots up to it, and writes the later ones from the weights an uninterrupted run
    has at those steps."""

    def __init__(self, task: PretrainingTask, ctx: StageContext, steps: list[int]):
        self.task, self.ctx, self.steps = task, ctx, set(steps)

    def on_train_start(self, trainer, pl_module) -> None:
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # with gradient accumulation the micro-batches after a step end here with the same global_step
        if step != self._last_step and step in self.steps and trainer.is_global_zero:
            self.write(pl_module, step)
        self._last_step = step

    def write(self, module: L.LightningModule, step: int) -> None:
        final = snapshot_dir(self.ctx.out_dir, step)
        staging = final.with_name(f".{final.name}.tmp")  # a kill mid-write leaves no snapshot, not half of one
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self.task.write(replace(self.ctx, out_dir=staging), module)
        shutil.rmtree(final, ignore_errors=True)  # a killed run's, of the same weights: it had no checkpoint since
        os.replace(staging, final)


class StartingStep(L.Callback):
    """The step training starts from: 0, or the resumed checkpoint's; None when `fit` trained nothing (resumed at
    max_steps, where Lightning never starts training)."""
    step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step


class ValidateAtLastStep(L.Callback):
    """Validation at the last step inside `fit`, also when max_steps is no multiple of the validation interval: a
    stopping Trainer validates before it stops (Lightning's early-stopping path). The `trainer.validate` after `fit`
    that this replaced set the strategy up again, and under DeepSpeed ZeRO-3 on a GPU that second set-up left the word
    embeddings on the CPU (docs/gpu.md); a rerun with no step left validates by
    _validate_last_step."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class SparseGradientSync(L.Callback):
    """DDP for the parameters whose gradient is sparse (ELMo's sampled softmax): DDP expects one only from an
    nn.Embedding(sparse=True) and fails on any other ("Cannot access storage of SparseTensorImpl", torch's
    produces_sparse_gradient), so they are left out of DDP and averaged here, by gloo's sparse all-reduce, after the
    last micro-batch's backward and before clipping and the optimizer step."""

    def __init__(self, module: nn.Module):
        self.names = sparse_gradient_parameters(module)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.names:  # before the strategy wraps the module in DDP
            torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(pl_module,
                                                                                                self.names)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        import torch.distributed as dist

        parameters = dict(pl_module.named_parameters())
        for name in self.names:
            grad = parameters[name].grad
            if grad is not None:
                dist.all_reduce(grad)
                grad.div_(dist.get_world_size())


def pin_batches(loader: Iterable[dict]) -> None:
    """Training on a GPU: the loader hands its batches over in page-locked memory, from which Lightning's copy to the
    device (non_blocking) runs asynchronously, overlapping the step before. Set here because the families build their
    loaders without knowing the device; a DataLoader reads the flag when each epoch's iterator starts."""
    if isinstance(loader, DataLoader):
        loader.pin_memory = True


def latest_checkpoint(out_dir: Path) -> Path | None:
    checkpoints = sorted((out_dir / CHECKPOINT_DIR).glob("step-*.ckpt"))  # zero-padded: name order is step order
    return checkpoints[-1] if checkpoints else None


def _step_of(checkpoint: str) -> int:
    return int(Path(checkpoint).name.removeprefix("step-").split(".")[0])


def _train_with_lightning(ctx: StageContext, task: PretrainingTask, p: PretrainConfig, settings: DistributedSettings,
                          rank: int,
                          world_size: int, plugins: tuple = ()) -> dict:
    out = ctx.out_dir
    module = built_module(task, ctx, p)
    data = task.data(ctx, module, p, rank, world_size)
    if settings.uses_cuda:
        pin_batches(data.train_loader)
    uses_deepspeed = settings.strategy == "deepspeed"  # which writes directories and clips by itself
    if uses_deepspeed:
        use_dense_gradients(module, DEEPSPEED_DENSE)
    history, monitor = LossHistory(), DivergenceMonitor(task.settings_key(ctx.cfg), data.uniform_loss)
    # AtomicCheckpointIO keeps the newest KEEP_CHECKPOINTS files; DeepSpeed writes directories through its own
    # engine, so there Lightning prunes them, keeping the highest steps
    pruning = dict(save_top_k=KEEP_CHECKPOINTS, monitor="step", mode="max") if uses_deepspeed else dict(save_top_k=-1)
    checkpoints = CheckpointAfterValidation(dirpath=out / CHECKPOINT_DIR, filename="step-{step:06d}",
                                            auto_insert_metric_name=False,
                                            every_n_train_steps=p.checkpoint_every_steps, **pruning)
    start = StartingStep()
    configured = [hydra.utils.instantiate(c) for c in ctx.cfg.callbacks.values()]
    callbacks = [*configured, history, monitor, start, TrainingPosition(data.position), checkpoints,
                 ValidateAtLastStep()]
    if snapshots := encoder_snapshot_steps(ctx.cfg, p, task.settings_key(ctx.cfg)):
        callbacks.append(EncoderSnapshots(task, ctx, snapshots))
    if world_size > 1 and not uses_deepspeed:
        callbacks.append(SparseGradientSync(module))
    strategy = lightning_strategy(settings, deepspeed_config(settings, data.batch_size, p.grad_clip))
    trainer = make_trainer(ctx, callbacks, max_steps=p.max_steps,
                           gradient_clip_val=None if uses_deepspeed else p.grad_clip,
                           # Lightning counts val_check_interval in batches, max_steps in optimizer steps
                           val_check_interval=min(p.val_every_steps, p.max_steps) * p.accumulate_grad_batches,
                           check_val_every_n_epoch=None, num_sanity_val_steps=0, strategy=strategy,
                           plugins=[*plugins, *(() if uses_deepspeed else (AtomicCheckpointIO(KEEP_CHECKPOINTS),))],
                           use_distributed_sampler=False, accumulate_grad_batches=p.accumulate_grad_batches)
    if settings.num_workers > 1:
        from ray.train.lightning import prepare_trainer

        trainer = prepare_trainer(trainer)
    resume_from = latest_checkpoint(out)
    if resume_from is None and ctx.cfg.ckpt_path and task.settings_key(ctx.cfg) == STARTS_FROM_CKPT_PATH:
        resume_from = Path(ctx.cfg.ckpt_path).expanduser()
    if resume_from:
        print(f"resuming from {resume_from}", flush=True)
    val_loader = data.val_loader
    started = time.perf_counter()
    with warnings.catch_warnings():
        # TrainingPosition restores the data position mid-epoch where Lightning cannot see it, so Lightning's warning
        # that resuming mid-epoch "can cause unreliable results" is wrong here: the resumed losses are exactly the
        # uninterrupted run's (tests/engine/test_resume.py).
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        trainer.fit(module, data.train_loader, val_loader, ckpt_path=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - started
    if start.step is None and history.last_step("val/loss") != trainer.global_step:
        # resumed at max_steps: fit trained nothing, and the checkpoint was saved before a validation at that step
        # (one that is no multiple of the validation interval, or a checkpoint of an earlier version)
        _validate_last_step(task, ctx, p, module, settings, trainer, val_loader, history, monitor)
    resumed_from = (trainer.global_step if start.step is None else start.step) if resume_from else None
    run = TrainingRun(trainer.global_step, trainer.global_step - (resumed_from or 0), seconds, world_size,
                      p.accumulate_grad_batches, history)
    with whole_parameters(module, settings):  # every rank enters: under ZeRO-3 gathering is a collective
        summary = _summary(task, module, data, run, resumed_from, trainer.precision)
        if trainer.is_global_zero:
            _write_outputs(task, ctx, module, history, summary, settings.uses_ray_train)
    return summary


def _validate_last_step(task: PretrainingTask, ctx: StageContext, p: PretrainConfig, module: L.LightningModule,
                        settings: DistributedSettings, trainer: L.Trainer, val_loader: Iterable[dict],
                        history: LossHistory, monitor: DivergenceMonitor) -> None:
    """Validates the trained weights, gathered into a fresh module, on this rank alone, as the DeepSpeed CPU loop does.
    Not `trainer.validate`: its second strategy set-up of the module that `fit` had set up left the word embeddings on
    the CPU under DeepSpeed ZeRO-3 on a GPU (tests/engine/test_distributed.py; docs/gpu.md)."""
    with whole_parameters(module, settings):  # every rank enters: under ZeRO-3 gathering is a collective
        final = built_module(task, ctx, p)
        final.load_state_dict(module.state_dict())
    metrics = _validate(final, val_loader, trainer.precision, trainer.strategy.root_device)
    history.record_validation(trainer.global_step, metrics)
    monitor.observe_heldout(trainer.global_step, metrics["val/loss"])


def _summary(task: PretrainingTask, module: L.LightningModule, data: PretrainingData, run: TrainingRun,
             resumed_from: int | None, precision: str) -> dict:
    return {"steps": run.steps, "resumed_from_step": resumed_from, "workers": run.world_size,
            "seconds": round(run.seconds, 1), "precision": precision,
            "final_val_loss": run.history.last("val/loss"),
            "uniform_val_loss": round(data.uniform_loss, 4),  # a uniform guess's: the loss that means nothing learned
            "num_parameters": sum(t.numel() for t in module.parameters()), **task.summary(module, data, run)}


def _write_outputs(task: PretrainingTask, ctx: StageContext, module: L.LightningModule, history: LossHistory,
                   summary: dict, in_ray_worker: bool) -> None:
    task.write(ctx, module)
    history.write_csv(ctx.out_dir / LOSS_CURVE)
    if in_ray_worker:
        write_json_atomically(ctx.out_dir / WORKER_SUMMARY, summary)


def _worker_context(config: dict) -> StageContext:
    """The stage context inside a Ray Train worker; the stage's W&B run stays with the stage (CSV logs here)."""
    return StageContext(OmegaConf.create(config["cfg"]), config["name"], Path(config["out_dir"]),
                        {k: Path(v) for k, v in config["inputs"].items()})


def _lightning_worker(config: dict) -> None:
    import ray.train
    from ray.train.lightning import RayLightningEnvironment

    ctx, task = _worker_context(config), config["task"]
    context = ray.train.get_context()
    p = task.settings(ctx.cfg)  # this worker's process begins here
    _train_with_lightning(ctx, task, p, DistributedSettings.from_config(ctx.cfg, p), context.get_world_rank(),
                          context.get_world_size(), plugins=(RayLightningEnvironment(),))


def _deepspeed_cpu_worker(config: dict) -> None:
    use_deepspeed_cpu_accelerator()
    keep_freed_memory_for_reuse()
    import torch.distributed as dist

    ctx, task = _worker_context(config), config["task"]
    out, p = ctx.out_dir, task.settings(ctx.cfg)  # this worker's process begins here
    settings = DistributedSettings.from_config(ctx.cfg, p)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    module = built_module(task, ctx, p)
    use_dense_gradients(module, DEEPSPEED_DENSE)
    if typed_settings(ctx.cfg.trainer, TrainerConfig).compile:  # no Trainer here to run CompileNetwork
        compile_network(module)
    data = task.data(ctx, module, p, rank, world_size)
    optimization = module.configure_optimizers()
    history, monitor = LossHistory(), DivergenceMonitor(task.settings_key(ctx.cfg), data.uniform_loss)
    checkpoint_dir = out / CHECKPOINT_DIR

    def on_step(step: int, loss: float, lr: float, rows_per_s: float) -> None:
        history.record_train(step, loss, lr, rows_per_s)
        monitor.observe_train(step, reduce_mean(loss))
        if rank == 0 and (step % PROGRESS_EVERY_N_STEPS == 0 or step == p.max_steps):
            print(progress_line(ctx.name, step, p.max_steps, loss, step - first_step,
                                time.perf_counter() - started), flush=True)
        if step % RELEASE_EVERY_N_BATCHES == 0:  # as every Lightning Trainer does (ReleaseFreedMemory)
            release_freed_memory()

    def rank_state(consumed: int) -> dict:
        return {"data": data.position.state_dict(consumed), "history": history.state_dict(),
                "monitor": monitor.state_dict()}

    def load_rank_state(state: dict) -> None:
        data.position.load_state_dict(state["data"])
        history.load_state_dict(state["history"])
        monitor.load_state_dict(state["monitor"])

    resumed_from = checkpoint_tags(checkpoint_dir)
    first_step = _step_of(resumed_from[-1]) if resumed_from else 0
    started = time.perf_counter()
    train_deepspeed(module, optimization["optimizer"], optimization["lr_scheduler"]["scheduler"],
                    deepspeed_config(settings, data.batch_size, p.grad_clip), data.train_loader, p.max_steps,
                    checkpoint_dir, p.checkpoint_every_steps, KEEP_CHECKPOINTS, rank_state, load_rank_state,
                    pretraining_advice(task.settings_key(ctx.cfg)), on_step)
    seconds = time.perf_counter() - started
    if rank != 0:
        return
    tag = checkpoint_tags(checkpoint_dir)[-1]
    # the fp32 weights of every partition, in a fresh module: what the encoder is written from, and validated
    final = built_module(task, ctx, p)
    final.load_state_dict(consolidated_state_dict(checkpoint_dir, tag))
    metrics = _validate(final, data.val_loader, resolve_precision(settings.precision))
    history.record_validation(p.max_steps, metrics)
    monitor.observe_heldout(p.max_steps, metrics["val/loss"])
    resumed_step = _step_of(resumed_from[-1]) if resumed_from else None
    run = TrainingRun(p.max_steps, p.max_steps - (resumed_step or 0), seconds, world_size,
                      p.accumulate_grad_batches, history)
    summary = {**_summary(task, final, data, run, resumed_step, resolve_precision(settings.precision)),
               "zero_stage": settings.zero_stage, "consolidated_from": str(checkpoint_dir / tag)}
    _write_outputs(task, ctx, final, history, summary, in_ray_worker=True)


def _validate(module: L.LightningModule, val_loader: Iterable[dict], precision: str,
              device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """The module's own validation, in this process alone, on `device`: what it logs under `val/`."""
    accelerator, devices = ("gpu", [device.index or 0]) if device.type == "cuda" else ("cpu", 1)
    trainer = L.Trainer(accelerator=accelerator, devices=devices, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, val_loader, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
