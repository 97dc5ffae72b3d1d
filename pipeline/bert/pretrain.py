"""The BERT pretraining stages: masked LM + next sentence prediction over an examples stage's Arrow files, in
BERT's two phases (Devlin et al. 2019, §A.2): `pretrain` at length 128 from random initialisation, then, when the run
has it, `pretrain_phase2` at length 512 from phase 1's final weights. One code path trains both (`Phase`).

Checkpoints go to `<out_dir>/checkpoints/` every `pretrain.checkpoint_every_steps` (in either phase); a rerun of a
crashed stage re-enters the same directory (pipeline/engine/dag.py) and continues from the newest one: weights,
optimizer, schedule, data position and RNG, so the steps after the resume are the steps an uninterrupted run would have
taken. One process by default; `trainer.num_workers > 1` or DeepSpeed train in Ray Train workers
(pipeline/engine/distributed.py).
"""
from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import hydra
import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import DataLoader, Subset

from data_prep.bert_examples import BertPretrainingCollator
from data_prep.shards import write_json_atomically
from data_prep.tokenizer import SPECIAL_TOKENS, load_tokenizer
from models import IGNORE_INDEX
from models.bert import BertConfig, load_pretrained, save_pretrained
from pipeline.bert.data import MaskedBatches, PretrainingInstances
from pipeline.bert.diagnostics import plateau_message, unigram_cross_entropy
from pipeline.bert.module import BertPretrainModule, bert_pretraining_losses
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.distributed import (
    DistributedSettings,
    checkpoint_tags,
    consolidated_state_dict,
    deepspeed_config,
    lightning_strategy,
    run_on_ray_workers,
    train_deepspeed,
    use_deepspeed_cpu_accelerator,
    validate_distributed,
)
from pipeline.engine.sampler import ResumableRandomSampler, SeededBatchSampler
from pipeline.engine.tracking import LossHistory
from pipeline.engine.training import keep_freed_memory_for_reuse, make_trainer

CHECKPOINT_DIR = "checkpoints"
KEEP_CHECKPOINTS = 2
WORKER_SUMMARY = "train_summary.json"  # how rank 0 of the Ray Train workers hands the stage its summary
# The MLM and NSP heads, beside encoder/: what a later phase needs, besides the encoder, to continue pretraining.
HEADS_FILE = "pretraining_heads.safetensors"


@dataclass(frozen=True)
class Phase:
    """One pretraining phase: the stage that trains it, the examples stage it reads, and where it starts from.

    Devlin et al. 2019, §A.2: 90 % of the steps at sequence length 128, as attention is quadratic in the length,
    then the rest at 512 "to learn the positional embeddings". Phase 2 continues phase 1's weights with a fresh
    optimizer and schedule, as NVIDIA's DeepLearningExamples BERT does."""
    stage: str
    examples: str
    length_key: str                  # the config key of its sequence length
    config_blocks: tuple[str, ...]   # its settings; a later block's keys override an earlier one's
    init_from: str | None = None     # the stage whose final weights (encoder and heads) it continues

    def settings(self, cfg: DictConfig) -> DictConfig:
        """This phase's pretraining settings: phase 2's block over `pretrain`, whose keys it need not repeat."""
        merged = {k: v for block in self.config_blocks
                  for k, v in OmegaConf.to_container(cfg[block], resolve=True).items()}
        settings = OmegaConf.create(merged)
        OmegaConf.set_struct(settings, True)  # a misspelt key is an error, as in the config it came from
        return settings

    def max_seq_length(self, cfg: DictConfig) -> int:
        """The phase's sequence length, refused before any work if the model has no position for its end."""
        length = int(OmegaConf.select(cfg, self.length_key))
        model = cfg.model.config
        positions = int(model.get("max_position_embeddings", BertConfig.max_position_embeddings))
        if model.get("position_embedding_type", "learned") != "relative" and length > positions:
            raise ValueError(f"{self.length_key}={length} is longer than the model's position table "
                             f"(model.config.max_position_embeddings={positions}); set "
                             f"model.config.max_position_embeddings={length} for the whole run (phase 1 must "
                             f"train with the table phase 2 uses, as conf/model/bert_base.yaml does), or lower "
                             f"{self.length_key}")
        return length


PHASES = (Phase("pretrain", "examples", "examples.max_seq_length", ("pretrain",)),
          Phase("pretrain_phase2", "examples_phase2", "pretrain_phase2.max_seq_length",
                ("pretrain", "pretrain_phase2"), init_from="pretrain"))


def phase_of(stage: str) -> Phase:
    """The phase a training or examples stage belongs to."""
    return next(p for p in PHASES if stage in (p.stage, p.examples))


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: every phase in the run (`stages`, those needed upstream included) fits the model's
    position table."""
    for phase in PHASES:
        if {phase.stage, phase.examples} & set(stages):
            phase.max_seq_length(cfg)


def encoder_stage(cfg: DictConfig) -> str:
    """The stage whose encoder the run's downstream stages read: its last pretraining phase in pipeline.stages."""
    in_run = [p.stage for p in PHASES if p.stage in cfg.pipeline.stages]
    return in_run[-1] if in_run else PHASES[0].stage


def pretrain(ctx: StageContext) -> dict:
    phase = phase_of(ctx.name)
    phase.max_seq_length(ctx.cfg)  # too long for the position table: fail now, not at the first batch
    validate_distributed(ctx.cfg)
    settings = DistributedSettings.from_config(ctx.cfg, phase.settings(ctx.cfg))
    if not settings.uses_ray_train:
        return _train_with_lightning(ctx, settings, rank=0, world_size=1)
    worker = _deepspeed_cpu_worker if settings.deepspeed_on_cpu else _lightning_worker
    (ctx.out_dir / WORKER_SUMMARY).unlink(missing_ok=True)
    run_on_ray_workers(worker, {"cfg": OmegaConf.to_container(ctx.cfg, resolve=True), "name": ctx.name,
                                "out_dir": str(ctx.out_dir), "inputs": {k: str(v) for k, v in ctx.inputs.items()}},
                       settings, ctx.out_dir)
    return json.loads((ctx.out_dir / WORKER_SUMMARY).read_text())



@dataclass
class _Setup:
    model: nn.Module
    module: BertPretrainModule
    train_loader: DataLoader
    batch_sampler: SeededBatchSampler
    val_batches: list[dict]
    train_instances: int
    unigram_mlm_loss: float  # the held-out MLM loss of predicting from token frequencies alone


def _build_model(cfg: DictConfig, vocab_size: int) -> nn.Module:
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["config"]["vocab_size"] = -(-vocab_size // 64) * 64  # padded to a multiple of 64 for matmul tiles
    return hydra.utils.instantiate(model_cfg, _convert_="all")


def _continue_from(model: nn.Module, pretrain_dir: Path) -> None:
    """Load a finished phase's encoder and MLM/NSP heads into `model`, which has the same configuration."""
    model.load_encoder_and_heads(load_pretrained(pretrain_dir / "encoder"), load_file(str(pretrain_dir / HEADS_FILE)))


def _setup(ctx: StageContext, rank: int, world_size: int) -> _Setup:
    cfg, phase = ctx.cfg, phase_of(ctx.name)
    p = phase.settings(cfg)
    tok = load_tokenizer(ctx.stage_dir("tokenizer"))
    vocab_size = tok.get_vocab_size()
    L.seed_everything(cfg.seed, workers=True)  # same initial weights on every rank
    model = _build_model(cfg, vocab_size)
    if phase.init_from:  # a resumed run then loads its own checkpoint over these
        _continue_from(model, ctx.stage_dir(phase.init_from))

    dataset = PretrainingInstances([read_arrow(p) for p in sorted(ctx.stage_dir(phase.examples).glob("*.arrow"))])
    order = np.random.default_rng(cfg.seed).permutation(len(dataset))
    n_val = max(1, min(int(len(dataset) * p.val_fraction), p.val_max_instances))
    # numpy indices, not lists: a list of 10^7 Python ints would take ~0.4 GB in the driver and in every loader worker
    train_set, val_set = Subset(dataset, order[n_val:]), Subset(dataset, order[:n_val])
    special_ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    collator = BertPretrainingCollator(pad_id=tok.token_to_id("[PAD]"), mask_id=tok.token_to_id("[MASK]"),
                                       vocab_size=vocab_size, special_ids=special_ids,
                                       mlm_probability=p.mlm_probability,
                                       max_predictions_per_seq=p.max_predictions_per_seq,
                                       generator=torch.Generator().manual_seed(cfg.seed + 1))
    batch_sampler = SeededBatchSampler(ResumableRandomSampler(len(train_set), cfg.seed, world_size, rank),
                                       p.batch_size)
    # A generator of its own: creating a loader iterator would otherwise draw from the global RNG (dropout's).
    train_loader = DataLoader(MaskedBatches(train_set, collator), sampler=batch_sampler, batch_size=None,
                              num_workers=p.num_workers, generator=torch.Generator().manual_seed(cfg.seed))
    # Held-out batches are masked once, so every evaluation scores the same predictions.
    val_rows = [val_set[i] for i in range(len(val_set))]
    val_batches = [collator(val_rows[i:i + p.batch_size]) for i in range(0, len(val_rows), p.batch_size)]
    counts = dataset.token_counts(vocab_size, excluded=order[:n_val])
    counts[special_ids] = 0  # never a masked-LM target
    targets = torch.cat([b["mlm_labels"][b["mlm_labels"] != IGNORE_INDEX] for b in val_batches]).numpy()
    # plain Python values: a checkpoint's hyperparameters must load with torch.load(weights_only=True)
    module = BertPretrainModule(model, lr=p.lr, weight_decay=p.weight_decay, betas=tuple(p.betas),
                                warmup_steps=p.warmup_steps, max_steps=p.max_steps, optimizer=p.optimizer,
                                next_sentence_prediction=p.next_sentence_prediction)
    return _Setup(model, module, train_loader, batch_sampler, val_batches, len(train_set),
                  unigram_cross_entropy(counts, targets))


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
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for old in sorted(path.parent.glob("step-*.ckpt"))[:-self.keep]:  # zero-padded: name order is step order
            old.unlink()


class TrainingPosition(L.Callback):
    """Saves and restores what Lightning's checkpoint leaves out: the data position and the global torch RNG.

    The position is the batches the trainer has processed this epoch, not what the sampler has handed out:
    DataLoader workers read ahead of the training step."""

    def __init__(self, batch_sampler: SeededBatchSampler):
        self.batch_sampler = batch_sampler

    def state_dict(self) -> dict:
        processed = self._trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"data": self.batch_sampler.state_dict(batches_consumed=processed), "rng": torch.get_rng_state()}

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state["data"])
        torch.set_rng_state(state["rng"])


def latest_checkpoint(out_dir: Path) -> Path | None:
    checkpoints = sorted((out_dir / CHECKPOINT_DIR).glob("step-*.ckpt"))  # zero-padded: name order is step order
    return checkpoints[-1] if checkpoints else None


def _train_with_lightning(ctx: StageContext, settings: DistributedSettings, rank: int, world_size: int,
                          plugins: tuple = ()) -> dict:
    cfg, phase, out = ctx.cfg, phase_of(ctx.name), ctx.out_dir
    p = phase.settings(cfg)
    setup = _setup(ctx, rank, world_size)
    history = LossHistory()
    checkpoints = ModelCheckpoint(dirpath=out / CHECKPOINT_DIR, filename="step-{step:06d}",
                                  auto_insert_metric_name=False, every_n_train_steps=p.checkpoint_every_steps,
                                  save_top_k=-1)
    strategy = lightning_strategy(settings, deepspeed_config(settings, p.batch_size, p.grad_clip))
    # DeepSpeed writes directories
    atomic_io = () if settings.strategy == "deepspeed" else (AtomicCheckpointIO(KEEP_CHECKPOINTS),)
    trainer = make_trainer(ctx, [history, TrainingPosition(setup.batch_sampler), checkpoints],
                           max_steps=p.max_steps, gradient_clip_val=None if settings.strategy == "deepspeed"
                           else p.grad_clip,
                           # Lightning counts val_check_interval in batches, max_steps in optimizer steps
                           val_check_interval=min(p.val_every_steps, p.max_steps) * p.accumulate_grad_batches,
                           check_val_every_n_epoch=None, num_sanity_val_steps=0, strategy=strategy,
                           plugins=[*plugins, *atomic_io], use_distributed_sampler=False,
                           accumulate_grad_batches=p.accumulate_grad_batches)
    if settings.num_workers > 1:
        from ray.train.lightning import prepare_trainer

        trainer = prepare_trainer(trainer)
    resume_from = latest_checkpoint(out)
    if resume_from:
        print(f"resuming from {resume_from}", flush=True)
    started = time.perf_counter()
    with warnings.catch_warnings():
        # TrainingPosition restores the data position mid-epoch where Lightning cannot see it, so Lightning's warning
        # that resuming mid-epoch "can cause unreliable results" is wrong here: the resumed losses are exactly the
        # uninterrupted run's (tests/test_resume.py).
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        trainer.fit(setup.module, setup.train_loader, DataLoader(setup.val_batches, batch_size=None),
                    ckpt_path=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - started
    steps_run = trainer.global_step - (_step_of(resume_from) if resume_from else 0)
    summary = {"steps": trainer.global_step, "resumed_from_step": _step_of(resume_from) if resume_from else None,
               "workers": world_size, "train_instances": setup.train_instances,
               "val_instances": sum(len(b["input_ids"]) for b in setup.val_batches), "seconds": round(seconds, 1),
               "padded_tokens_per_s": round(steps_run * p.accumulate_grad_batches * p.batch_size * world_size
                                            * phase.max_seq_length(cfg) / seconds, 1),
               "precision": trainer.precision, "final_val_loss": history.last("val/loss"),
               **_learning_summary(history.last("val/mlm_loss"), history.last("val/mlm_acc"),
                                   history.last("val/nsp_acc") if p.next_sentence_prediction else None, setup),
               "num_parameters": sum(t.numel() for t in setup.model.parameters()), **_phase_summary(ctx)}
    if trainer.is_global_zero:
        _write_outputs(out, setup.model, history, summary, settings.uses_ray_train)
    return summary


def _learning_summary(mlm_loss: float | None, mlm_acc: float | None, nsp_acc: float | None, setup: _Setup) -> dict:
    """The held-out figures that say whether pretraining learned anything, next to what frequencies alone give: the
    unigram MLM loss and the NSP majority rate. A run still on the unigram plateau says so on the console too."""
    labels = torch.cat([b["next_sentence_label"] for b in setup.val_batches])
    warning = plateau_message(mlm_loss, setup.unigram_mlm_loss)
    if warning:
        print(f"WARNING: {warning}", flush=True)
    return {"final_val_mlm_loss": mlm_loss, "unigram_mlm_loss": round(setup.unigram_mlm_loss, 4),
            "final_val_mlm_acc": mlm_acc, "final_val_nsp_acc": nsp_acc,
            "nsp_majority_rate": round(float(max(labels.float().mean(), 1 - labels.float().mean())), 4),
            "plateau_warning": warning}


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step-").split(".")[0])


def _phase_summary(ctx: StageContext) -> dict:
    phase = phase_of(ctx.name)
    return {"max_seq_length": phase.max_seq_length(ctx.cfg),
            "initialised_from": str(ctx.stage_dir(phase.init_from)) if phase.init_from else None}


def _write_outputs(out: Path, model: nn.Module, history: LossHistory, summary: dict, in_ray_worker: bool) -> None:
    save_pretrained(model.bert, out / "encoder")
    save_file(model.heads_state_dict(), str(out / HEADS_FILE))
    history.write_csv(out / "loss_curve.csv")
    if in_ray_worker:
        write_json_atomically(out / WORKER_SUMMARY, summary)


def _worker_context(config: dict) -> StageContext:
    """The stage context inside a Ray Train worker; the stage's W&B run stays with the stage (CSV logs here)."""
    return StageContext(OmegaConf.create(config["cfg"]), config["name"], Path(config["out_dir"]),
                        {k: Path(v) for k, v in config["inputs"].items()})


def _lightning_worker(config: dict) -> None:
    import ray.train
    from ray.train.lightning import RayLightningEnvironment

    ctx = _worker_context(config)
    context = ray.train.get_context()
    settings = DistributedSettings.from_config(ctx.cfg, phase_of(ctx.name).settings(ctx.cfg))
    _train_with_lightning(ctx, settings, context.get_world_rank(), context.get_world_size(),
                          plugins=(RayLightningEnvironment(),))


class PretrainingObjective(nn.Module):
    """BertPretrainModule's losses as a forward pass: a DeepSpeed engine trains a module through `forward`."""

    def __init__(self, model: nn.Module, next_sentence_prediction: bool = True):
        super().__init__()
        self.model, self.next_sentence_prediction = model, next_sentence_prediction

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        return bert_pretraining_losses(self.model, batch, self.next_sentence_prediction)


def _deepspeed_cpu_worker(config: dict) -> None:
    use_deepspeed_cpu_accelerator()
    keep_freed_memory_for_reuse()
    import torch.distributed as dist

    ctx = _worker_context(config)
    cfg, out = ctx.cfg, ctx.out_dir
    p = phase_of(ctx.name).settings(cfg)
    settings = DistributedSettings.from_config(cfg, p)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    setup = _setup(ctx, rank, world_size)
    optimization = setup.module.configure_optimizers()
    history = LossHistory()
    checkpoint_dir = out / CHECKPOINT_DIR
    sampler = setup.batch_sampler

    def record(step: int, loss: float) -> None:
        history.rows.append({"step": step, "split": "train", "name": "train/loss", "value": loss})

    started = time.perf_counter()
    resumed_from = checkpoint_tags(checkpoint_dir)
    train_deepspeed(PretrainingObjective(setup.model, p.next_sentence_prediction), optimization["optimizer"],
                    optimization["lr_scheduler"]["scheduler"],
                    deepspeed_config(settings, p.batch_size, p.grad_clip), batches=lambda: setup.train_loader,
                    data_state=lambda consumed: {**sampler.state_dict(batches_consumed=consumed),
                                                 "history": history.rows},
                    load_data_state=lambda state: (sampler.load_state_dict(state),
                                                   history.rows.extend(state["history"])),
                    next_epoch=lambda: sampler.set_epoch(sampler.sampler.epoch + 1), max_steps=p.max_steps,
                    checkpoint_dir=checkpoint_dir, checkpoint_every_steps=p.checkpoint_every_steps,
                    keep_checkpoints=KEEP_CHECKPOINTS, on_step=record)
    seconds = time.perf_counter() - started
    if rank != 0:
        return
    tag = checkpoint_tags(checkpoint_dir)[-1]
    model = _build_model(cfg, load_tokenizer(ctx.stage_dir("tokenizer")).get_vocab_size())
    state = consolidated_state_dict(checkpoint_dir, tag)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    val = _validate(model, setup.val_batches, p.next_sentence_prediction)
    history.rows.extend({"step": p.max_steps, "split": "val", "name": f"val/{k}", "value": v} for k, v in val.items())
    summary = {"steps": p.max_steps,
               "resumed_from_step": int(resumed_from[-1].removeprefix("step-")) if resumed_from else None,
               "workers": world_size, "zero_stage": settings.zero_stage, "consolidated_from": str(checkpoint_dir / tag),
               "train_instances": setup.train_instances, "seconds": round(seconds, 1),
               "final_val_loss": round(val["loss"], 4),
               **_learning_summary(round(val["mlm_loss"], 4), round(val["mlm_acc"], 4),
                                   round(val["nsp_acc"], 4) if p.next_sentence_prediction else None, setup),
               "num_parameters": sum(t.numel() for t in model.parameters()), **_phase_summary(ctx)}
    _write_outputs(out, model, history, summary, in_ray_worker=True)


@torch.no_grad()
def _validate(model: nn.Module, batches: list[dict], next_sentence_prediction: bool) -> dict[str, float]:
    objective = PretrainingObjective(model, next_sentence_prediction).eval()
    results = [objective(batch) for batch in batches]
    return {k: float(torch.stack([r[k] for r in results]).mean()) for k in ("loss", "mlm_loss", "mlm_acc", "nsp_acc")}
