"""Pretraining that has diverged fails its stage instead of being saved as complete.

Gradient clipping keeps a diverged run's loss finite (`pretrain.lr=1e3` took BERT's loss from 9.7 to
689,714 in 20 steps, held-out perplexity 5e21), so a check for NaN alone lets it through. Two signs, both far from
anything healthy training shows:
- the training loss, averaged over the last `WINDOW` steps, is back above the first step's (an untrained model's)
  and at least `GROWTH` times the lowest such average so far;
- the held-out loss is more than `UNIFORM_FACTOR` times that of a uniform guess over the model's outputs: the model
  predicts worse than one that knows nothing.
Every rank sees the same (reduced) losses, so all of them stop together.
"""
from __future__ import annotations

import math
from collections import deque

import lightning as L
import torch

WINDOW = 10
GROWTH = 3.0
UNIFORM_FACTOR = 1.5


class PretrainingDiverged(RuntimeError):
    pass


class DivergenceMonitor(L.Callback):
    """`settings_key`: the config block of the run's optimiser settings, named in the message (pretrain,
    pretrain_phase2 or gpt.pretrain); `uniform_loss`: the family's loss of a uniform guess on its held-out data."""

    def __init__(self, settings_key: str, uniform_loss: float):
        self.settings_key, self.uniform_loss = settings_key, uniform_loss
        self.first: float | None = None
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.lowest = math.inf

    def _advice(self) -> str:
        k = self.settings_key
        return (f"lower {k}.lr or raise {k}.warmup_steps and run again (the output of this run is not kept as "
                "complete)")

    def observe_train(self, step: int, loss: float) -> None:
        if self.first is None:
            self.first = loss
        self.recent.append(loss)
        mean = sum(self.recent) / len(self.recent)
        self.lowest = min(self.lowest, mean)
        if mean > self.first and mean >= GROWTH * self.lowest:
            raise PretrainingDiverged(
                f"pretraining diverged: the training loss (mean of the last {len(self.recent)} steps) rose to "
                f"{mean:.4g} at step {step}, from a low of {self.lowest:.4g} and above the {self.first:.4g} of the "
                f"untrained model; {self._advice()}")

    def observe_heldout(self, step: int, loss: float) -> None:
        if loss > UNIFORM_FACTOR * self.uniform_loss:
            raise PretrainingDiverged(
                f"pretraining diverged: the held-out loss at step {step} is {loss:.4g}, more than {UNIFORM_FACTOR} "
                f"times the {self.uniform_loss:.4g} of a uniform guess over the vocabulary; {self._advice()}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.observe_train(trainer.global_step, float(trainer.strategy.reduce(loss.detach(), reduce_op="mean")))

    def on_validation_end(self, trainer, pl_module) -> None:
        loss = trainer.callback_metrics.get("val/loss")
        if loss is not None and not trainer.sanity_checking:
            self.observe_heldout(trainer.global_step, float(trainer.strategy.reduce(loss, reduce_op="mean")))

    def state_dict(self) -> dict:
        return {"first": self.first, "recent": list(self.recent), "lowest": self.lowest}

    def load_state_dict(self, state: dict) -> None:
        self.first, self.lowest = state["first"], state["lowest"]
        self.recent = deque(state["recent"], maxlen=WINDOW)


def reduce_mean(value: float) -> float:
    """`value` averaged over the ranks of the process group (itself in one process): for the DeepSpeed loop, which
    has no Lightning strategy to reduce with."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    tensor = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor) / dist.get_world_size()
