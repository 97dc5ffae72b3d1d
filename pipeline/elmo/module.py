"""ELMo in Lightning: biLM pretraining with the LSTM state carried from window to window and held-out perplexity. Its
batches are truncated-BPTT windows over whole books (pipeline/elmo/data.py says why); the elmo_pretrain stage
(pipeline/elmo/pretrain.py) checkpoints the carried state with the position (WindowPosition).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.elmo import BiLMOutput, BiLMState, detach_state
from pipeline.engine.module import OptimizerSettings, PretrainModule


class ElmoPretrainModule(PretrainModule):
    """Sum of forward and backward next-token cross-entropies (Peters et al. §3.1) on a `BiLanguageModel`, the LSTM
    state carried between windows (and between held-out windows, separately). Held-out perplexity is
    exp(total NLL / tokens) per direction over the whole held-out set; `val/perplexity` is their average, the number
    the paper reports."""

    def __init__(self, model: nn.Module, optimizer: OptimizerSettings):
        super().__init__(model, optimizer)
        self._state = {"train": None, "val": None}
        self._val_totals = torch.zeros(4, dtype=torch.float64)  # forward NLL, backward NLL, forward n, backward n
        self.heldout_perplexities: dict[str, float] = {}

    def _step(self, batch: dict, split: str) -> BiLMOutput:
        out = self.model(batch["forward_inputs"], batch["backward_inputs"], batch["forward_targets"],
                         batch["backward_targets"], state=self._state[split], reset=batch["reset"])
        self._state[split] = detach_state(out.state)
        return out

    def carried_state(self, split: str) -> BiLMState | None:
        return self._state[split]

    def carry_state(self, split: str, state: BiLMState | None) -> None:
        self._state[split] = state

    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        """A training window's loss, the state carried on."""
        return {"loss": self._step(batch, "train").loss}

    def on_validation_epoch_start(self) -> None:
        self._state["val"] = None
        self._val_totals.zero_()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self._step(batch, "val")
        self._val_totals += torch.stack([out.forward_nll_sum, out.backward_nll_sum, out.forward_tokens,
                                         out.backward_tokens]).detach().double().cpu()

    def on_validation_epoch_end(self) -> None:
        fwd_nll, bwd_nll, fwd_n, bwd_n = self._val_totals.tolist()
        if fwd_n == 0:
            return
        forward, backward = float(np.exp(fwd_nll / fwd_n)), float(np.exp(bwd_nll / bwd_n))
        self.heldout_perplexities = {"forward": forward, "backward": backward, "average": (forward + backward) / 2}
        self.log_dict({f"val/{'perplexity' if k == 'average' else k + '_perplexity'}": v
                       for k, v in self.heldout_perplexities.items()}, prog_bar=True)
        self.log("val/loss", (fwd_nll / fwd_n + bwd_nll / bwd_n), prog_bar=False)
