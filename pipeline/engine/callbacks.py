"""The Lightning callbacks of the pretraining loop that make a run resumable and exact: when a checkpoint is saved
(after its step's validation), what it carries besides Lightning's state (every rank's data position and RNG), the
step training started from, validation at the last step, and the averaging of sparse gradients that DDP leaves out.
"""
from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from pipeline.engine.distributed import gather_from_ranks, this_ranks_state
from pipeline.engine.optim import sparse_gradient_parameters
from pipeline.engine.pretraining_task import DataPosition


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
