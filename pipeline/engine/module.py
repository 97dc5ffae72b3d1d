"""The training contract of every family: a family's LightningModule subclasses `PretrainModule` and supplies only
`model_step` (its forward and loss; held-out scoring where a mean of batch losses is not the figure), and the engine
does the rest, the same for every family and in both training loops (Lightning's, and the DeepSpeed CPU loop of
pipeline/engine/deepspeed_loop.py, which trains the module through `forward`):
- the optimizer and its schedule, built from the settings block (`OptimizerSettings`: `pretrain`, or a block over it
  such as `pretrain_phase2` or `gpt.pretrain`), with no weight decay on biases and LayerNorm (pipeline/engine/optim.py);
- gradient clipping by norm (`<block>.grad_clip`), sparse gradients (ELMo's sampled softmax) included;
- the check that the loss is finite (`check_finite_loss`, which the DeepSpeed loop calls too);
- logging: every value of `model_step` as `train/<name>` and `val/<name>`, the learning rate and the throughput.
The divergence check, checkpoints, accumulation and the choice of loop are the pretraining harness's
(pipeline/engine/pretraining.py), which a family reaches only through its `PretrainingTask`."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import lightning as L
import torch
from torch import nn

from pipeline.engine.optim import (
    LR_DECAYS,
    PRETRAIN_OPTIMIZERS,
    TAKE_SPARSE_GRADIENTS,
    clip_grad_norm_with_sparse,
    sparse_gradient_parameters,
    use_dense_gradients,
)

if TYPE_CHECKING:
    from pipeline.schema import PretrainConfig


class NonFiniteLoss(FloatingPointError):
    """A training loss that is NaN or infinite: the weights, or the step that made them, blew up."""


def check_finite_loss(loss: torch.Tensor, step: int, advice: str) -> None:
    """Raise NonFiniteLoss, saying `advice` (what to change), unless `loss` is finite. Every training loop calls this
    before the backward pass, so no non-finite gradient ever reaches the weights or a checkpoint."""
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"training loss is {loss.item()} at step {step}; {advice}")


def pretraining_advice(block: str) -> str:
    """What to change when pretraining with the settings of `block` blows up."""
    return f"lower {block}.lr, raise {block}.warmup_steps or set {block}.grad_clip"


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer and schedule of a pretraining run, read once from its settings block."""
    block: str                   # the config block they come from (pretrain, pretrain_phase2, gpt.pretrain): messages
    optimizer: str               # a name in PRETRAIN_OPTIMIZERS
    lr: float                    # the peak, after the warmup
    weight_decay: float          # on weight matrices and embeddings; none on biases and LayerNorm
    betas: tuple[float, float]
    warmup_steps: int
    max_steps: int               # where the decay reaches 0
    lr_decay: str                # a name in LR_DECAYS

    def __post_init__(self):
        if self.optimizer not in PRETRAIN_OPTIMIZERS:
            raise ValueError(f"{self.block}.optimizer={self.optimizer!r} is not known; use one of "
                             f"{sorted(PRETRAIN_OPTIMIZERS)}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"{self.block}.lr_decay={self.lr_decay!r} is not known; use one of {list(LR_DECAYS)}")

    @classmethod
    def of(cls, s: PretrainConfig, block: str) -> "OptimizerSettings":
        """Those of a PretrainingTask's settings (pipeline/engine/pretraining_task.py), whose block `block` names."""
        return cls(block=block, optimizer=str(s.optimizer), lr=float(s.lr), weight_decay=float(s.weight_decay),
                   betas=(float(s.betas[0]), float(s.betas[1])), warmup_steps=int(s.warmup_steps),
                   max_steps=int(s.max_steps), lr_decay=str(s.lr_decay))


def log_step_outputs(module: L.LightningModule, split: str, out: dict, batch_size: int) -> None:
    """Every value of a model_step's output as `<split>/<name>`: per step in training, per epoch otherwise; the
    loss also on the progress bar."""
    on_step = split == "train"
    module.log_dict({f"{split}/{k}": v.detach() for k, v in out.items() if k != "loss"}, on_step=on_step,
                    on_epoch=not on_step, batch_size=batch_size)
    module.log(f"{split}/loss", out["loss"].detach(), prog_bar=True, on_step=on_step, on_epoch=not on_step,
               batch_size=batch_size)


class PretrainModule(L.LightningModule):
    """A family's pretraining objective on its network `model`. Subclasses define `model_step(batch)` -> {"loss": ...,
    any other figure to log}, and override `validation_step` (and its epoch hooks) only where the held-out figure is
    not a mean over batches (GPT's and ELMo's perplexity over every held-out token). `hparams`: the family's own
    hyperparameters, plain Python values (a checkpoint's must load with torch.load(weights_only=True))."""

    def __init__(self, model: nn.Module, optimizer: OptimizerSettings, **hparams):
        super().__init__()
        self.model, self.optimizer_settings = model, optimizer
        self.save_hyperparameters({**asdict(optimizer), **hparams})
        if optimizer.optimizer not in TAKE_SPARSE_GRADIENTS:
            use_dense_gradients(model, f"{optimizer.block}.optimizer={optimizer.optimizer} takes no sparse ones")
        self._batch_started: float | None = None

    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must define model_step(batch) -> {{'loss': ...}}")

    @staticmethod
    def rows(batch: dict) -> int:
        """The rows of a batch (instances, blocks, windows, triples): every entry of a batch is batch-first."""
        return len(next(iter(batch.values())))

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """The training losses: what the DeepSpeed loop trains through (its engine calls the module)."""
        return self.model_step(batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model_step(batch)
        check_finite_loss(out["loss"], self.global_step, pretraining_advice(self.optimizer_settings.block))
        log_step_outputs(self, "train", out, self.rows(batch))
        if self._trainer is not None and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False,
                     batch_size=self.rows(batch))
        return out["loss"]

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        # forward, backward and (at the last micro-batch) the optimizer step of this process; not the data loading
        if self._batch_started is not None:
            rows = self.rows(batch)
            self.log("train/rows_per_s", rows / max(time.perf_counter() - self._batch_started, 1e-9), on_step=True,
                     on_epoch=False, batch_size=rows)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        log_step_outputs(self, "val", self.model_step(batch), self.rows(batch))

    def configure_optimizers(self):
        s = self.optimizer_settings
        return PRETRAIN_OPTIMIZERS[s.optimizer](self.model, s.lr, s.weight_decay, s.betas, s.warmup_steps,
                                                s.max_steps, decay=s.lr_decay)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        if not sparse_gradient_parameters(self.model):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        # torch's clip_grad_norm_, which Lightning clips with, refuses sparse gradients (ELMo's sampled softmax)
        if gradient_clip_val:
            if gradient_clip_algorithm not in (None, "norm"):
                raise ValueError(f"{self.optimizer_settings.block}.grad_clip clips by norm a model with sparse "
                                 f"gradients; got gradient_clip_algorithm={gradient_clip_algorithm!r}")
            clip_grad_norm_with_sparse(self.model.parameters(), gradient_clip_val)
