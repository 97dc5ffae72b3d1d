"""The engine owns training (pipeline/engine/module.py): every family's pretraining stage builds the optimizer the
`pretrain` block names, clips and accumulates as it says, and stops on a non-finite loss with the one error, in the
Lightning loop and in the DeepSpeed CPU loop alike."""
from __future__ import annotations

import csv
import sys
import types
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from omegaconf import open_dict
from torch.utils.data import DataLoader

from pipeline.engine.dag import MARKER, StageContext, execute_stage
from pipeline.engine.module import NonFiniteLoss, PretrainModule
from pipeline.engine.optim import Lamb, LazyAdamW, sparse_gradient_parameters
from pipeline.engine.training import LossHistory
from pipeline.schema import LrDecay, PretrainConfig, PretrainOptimizer
from pipeline.stages import STAGES
from tests.helpers import TINY_FAMILIES, TinyRun, family_config, optimizer_settings

FAMILIES = ["bert", "elmo", "skip_thought", "gpt"]


def _task_and_context(run: TinyRun, family: str, cfg=None):
    name = TINY_FAMILIES[family].pretraining_stage
    task = STAGES[name].fn.keywords["task"]
    return task, StageContext(cfg or run.cfg, name, run.stage_dir(name),
                              {u: run.stage_dir(u) for u in run.plan.stages[name].upstream})


@pytest.mark.parametrize("optimizer, built", [("adamw", LazyAdamW), ("lamb", Lamb)])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_pretrains_with_the_optimizer_pretrain_names(family_data, family, optimizer, built):
    """pretrain.optimizer was read by BERT alone: lamb silently trained GPT, ELMo and Skip-Thought with AdamW."""
    run = family_data(family)
    cfg = run.cfg.copy()
    cfg.pretrain.optimizer = optimizer
    task, ctx = _task_and_context(run, family, cfg)
    module = task.build_module(ctx, task.settings(ctx.cfg))
    assert isinstance(module, PretrainModule)
    assert type(module.configure_optimizers()["optimizer"]) is built
    if optimizer == "lamb":  # ELMo's sampled softmax: LAMB's trust ratio needs the whole gradient, so it is dense
        assert sparse_gradient_parameters(module.model) == []


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_family_hands_the_engine_typed_settings_with_the_values_the_command_line_set(tmp_path, family):
    """A family's pretraining settings are made once from its blocks as the schema's typed object (enums, lists of
    floats): what the command line set, not a DictConfig the harness reads by key."""
    cfg = family_config(tmp_path, family, ["pretrain.lr_decay=noam", "pretrain.optimizer=lamb", "pretrain.lr=3e-4"])
    task = STAGES[TINY_FAMILIES[family].pretraining_stage].fn.keywords["task"]
    settings = task.settings(cfg)
    assert isinstance(settings, PretrainConfig)
    assert (settings.lr_decay, settings.optimizer, settings.lr) == (LrDecay.noam, PretrainOptimizer.lamb, 3e-4)
    assert isinstance(settings.lr_decay, LrDecay) and all(isinstance(beta, float) for beta in settings.betas)


def _nan_weights(module: PretrainModule) -> None:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.fill_(float("nan"))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_non_finite_loss_stops_every_family_with_the_same_error(family_data, family):
    run = family_data(family)
    task, ctx = _task_and_context(run, family)
    module = task.build_module(ctx, task.settings(ctx.cfg))
    data = task.data(ctx, module, task.settings(ctx.cfg), 0, 1)
    _nan_weights(module)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.raises(NonFiniteLoss, match=r"^training loss is nan at step 0; lower pretrain.lr, raise "
                                            r"pretrain.warmup_steps or set pretrain.grad_clip$"):
        trainer.fit(module, data.train_loader)


class _FakeDeepSpeedEngine:
    """What train_deepspeed uses of DeepSpeed's engine: the module's forward, backward, step and the step count."""

    def __init__(self, model):
        self.model, self.global_steps = model, 0

    def __call__(self, batch):
        return self.model(batch)

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.global_steps += 1


def _gpt_under_fake_deepspeed(family_data, monkeypatch, engine):
    """The tiny GPT's pretraining task, context, module, data and optimization, with `deepspeed.initialize` giving
    `engine(model, optimizer, scheduler)`: the DeepSpeed CPU loop without DeepSpeed."""
    fake = types.ModuleType("deepspeed")
    fake.initialize = lambda model, optimizer, lr_scheduler, config: (
        engine(model, optimizer, lr_scheduler), None, None, None)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    task, ctx = _task_and_context(family_data("gpt"), "gpt")
    module = task.build_module(ctx, task.settings(ctx.cfg))
    return task, ctx, module, task.data(ctx, module, task.settings(ctx.cfg), 0, 1), module.configure_optimizers()


def test_the_deepspeed_loop_stops_on_a_non_finite_loss_with_the_same_check(family_data, tmp_path, monkeypatch):
    """The DeepSpeed CPU loop (no Lightning) trains the same module through its forward, and checks its loss with
    the check the Lightning loop runs: the same error, the last good checkpoint named."""
    from pipeline.engine.deepspeed_loop import train_deepspeed
    from pipeline.engine.module import pretraining_advice

    task, ctx, module, data, optimization = _gpt_under_fake_deepspeed(
        family_data, monkeypatch, lambda model, optimizer, scheduler: _FakeDeepSpeedEngine(model))
    _nan_weights(module)
    with pytest.raises(NonFiniteLoss, match=r"^training loss is nan at step 0; lower pretrain.lr, raise "
                                            r"pretrain.warmup_steps or set pretrain.grad_clip \(the last good "
                                            r"checkpoint is kept in .*checkpoints\)$"):
        train_deepspeed(module, optimization["optimizer"], optimization["lr_scheduler"]["scheduler"], {},
                        data.train_loader, 3, tmp_path / "checkpoints", 10, 2, lambda consumed: {},
                        lambda state: None, pretraining_advice(task.settings_key(ctx.cfg)))


class _SteppingFakeEngine(_FakeDeepSpeedEngine):
    """The fake engine, stepping the optimizer and its schedule as DeepSpeed's engine.step() does."""

    def __init__(self, model, optimizer, scheduler):
        super().__init__(model)
        self.optimizer, self.scheduler = optimizer, scheduler

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        super().step()


class _Stop(Exception):
    pass


def test_the_deepspeed_loop_reports_each_steps_loss_learning_rate_and_throughput(family_data, monkeypatch):
    """What the Lightning loop logs per step, the DeepSpeed CPU loop hands its on_step: the loss, the rate the step
    took (the schedule's, before it moves on) and the rows trained per second."""
    from pipeline.engine.deepspeed_loop import train_deepspeed

    _, ctx, module, data, optimization = _gpt_under_fake_deepspeed(family_data, monkeypatch, _SteppingFakeEngine)
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    expected_lrs = [scheduler.base_lrs[0] * scheduler.lr_lambdas[0](t) for t in range(3)]  # LambdaLR's rates
    reported = []

    def on_step(step, loss, lr, rows_per_s):
        reported.append((step, loss, lr, rows_per_s))
        if step == 3:
            raise _Stop  # before the first checkpoint, which needs a process group

    with pytest.raises(_Stop):
        train_deepspeed(module, optimizer, scheduler, {}, data.train_loader, 10, ctx.out_dir / "checkpoints", 100, 2,
                        lambda consumed: {}, lambda state: None, "advice", on_step)
    assert [step for step, *_ in reported] == [1, 2, 3]
    assert all(np.isfinite(loss) and loss > 0 for _, loss, _, _ in reported)
    assert [lr for *_, lr, _ in reported] == pytest.approx(expected_lrs)  # warming up: each step's own rate
    assert len(set(lr for *_, lr, _ in reported)) == 3
    assert all(rows_per_s > 0 for *_, rows_per_s in reported)


STEPS: list[dict] = []  # what StepProbe saw, per optimizer step


class StepProbe(L.Callback):
    """callbacks.probe in a test's config: per optimizer step, the training batches begun by then and the global
    gradient norm the optimizer stepped with (read by a step post-hook, after clipping)."""

    def on_train_start(self, trainer, pl_module):
        STEPS.clear()
        self.batches = 0
        trainer.optimizers[0].register_step_post_hook(
            lambda *_: STEPS.append({"batches": self.batches, "norm": _gradient_norm(pl_module)}))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches += 1


def _gradient_norm(module) -> float:
    grads = [p.grad.coalesce().values() if p.grad.is_sparse else p.grad for p in module.parameters()
             if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_clips_and_accumulates_as_pretrain_says(family_data, family, tmp_path):
    """pretrain.grad_clip and pretrain.accumulate_grad_batches reach every family's training, ELMo's sparse
    gradients included: each optimizer step comes after `accumulate_grad_batches` batches, with the gradient's norm
    cut to `grad_clip` (far below any unclipped one)."""
    tiny = family_data(family)
    run = TinyRun(family_config(Path(tiny.cfg.paths.cache_dir).parent, family, [
        "pretrain.max_steps=2", "pretrain.accumulate_grad_batches=2", "pretrain.grad_clip=1e-4",
        "pretrain.val_every_steps=2"]))
    with open_dict(run.cfg):
        run.cfg.callbacks = {"probe": {"_target_": f"{__name__}.StepProbe"}}
    name = TINY_FAMILIES[family].pretraining_stage
    inputs = {u: (run.plan.dirs[u], run.plan.hashes[u]) for u in run.plan.stages[name].upstream}
    execute_stage(STAGES, run.cfg, name, run.plan.hashes[name], tmp_path / name, inputs, None)
    assert (tmp_path / name / MARKER).exists()
    assert [s["batches"] for s in STEPS] == [2, 4]
    # torch's clip scales by grad_clip / (norm + 1e-6): Quick-Thoughts' gradient at its start (norm ~5e-4) ends 0.2 %
    # below grad_clip
    assert [s["norm"] for s in STEPS] == pytest.approx([1e-4, 1e-4], rel=1e-2)


class _Regression(PretrainModule):
    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        error = self.model(batch["x"]).squeeze(-1) - batch["y"]
        return {"loss": error.pow(2).mean(), "mean_abs_error": error.abs().mean()}


def test_the_engine_logs_every_figure_of_the_step_the_learning_rate_and_the_throughput(tmp_path):
    """What a family's model_step returns is logged under train/ and val/ with nothing more from the family; the
    engine adds the learning rate each step took (here the warmup, then the linear decay) and the rows per second."""
    torch.manual_seed(0)
    batches = [{"x": torch.randn(8, 3), "y": torch.randn(8)} for _ in range(4)]
    module = _Regression(torch.nn.Linear(3, 1), optimizer_settings(0.1, warmup_steps=2, max_steps=4))
    history = LossHistory()  # the curves a Ray Train worker's stage logs into W&B afterwards
    trainer = L.Trainer(accelerator="cpu", max_steps=4, log_every_n_steps=1, logger=CSVLogger(tmp_path, name="m"),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, val_check_interval=4, callbacks=[history])
    trainer.fit(module, DataLoader(batches, batch_size=None), DataLoader(batches[:1], batch_size=None))
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    logged = {name: [float(r[name]) for r in rows if r.get(name)] for name in rows[0]}
    assert logged["train/lr"] == pytest.approx([0.05, 0.1, 0.1, 0.05])  # decaying to 0 at step 4
    assert len(logged["train/loss"]) == len(logged["train/mean_abs_error"]) == 4
    assert len(logged["train/rows_per_s"]) == 4 and min(logged["train/rows_per_s"]) > 0
    assert len(logged["val/loss"]) == len(logged["val/mean_abs_error"]) == 1
    recorded = {name: [r["value"] for r in history.rows if r["name"] == name] for name in ("train/lr", "train/loss")}
    assert recorded["train/lr"] == pytest.approx(logged["train/lr"])
    assert recorded["train/loss"] == pytest.approx(logged["train/loss"])
    assert len([r for r in history.rows if r["name"] == "train/rows_per_s" and r["value"] > 0]) == 4
