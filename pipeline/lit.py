"""Thin LightningModules around the plain nn.Modules in models/: losses, metrics, optimiser, schedule.

One `model_step` serves train/val/test (lightning-hydra-template); the model itself is injected (Hydra `_target_`)."""
from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


def adamw_with_linear_schedule(module: nn.Module, lr: float, weight_decay: float, betas, warmup_steps: int,
                               total_steps: int):
    """AdamW without decay on biases and LayerNorm weights, linear warmup then linear decay to 0 (BERT §A.2)."""
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=tuple(betas))
    warmup_steps = max(1, warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class BertPretrainModule(L.LightningModule):
    """Masked LM + next sentence prediction (Devlin et al. 2019, §3.1) on a `BertForPreTraining`."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, betas, warmup_steps: int,
                 max_steps: int):
        super().__init__()
        self.model = model
        self.save_hyperparameters(ignore=["model"])

    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        mlm_logits, nsp_logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                            mlm_positions=batch["mlm_positions"])
        labels = batch["mlm_labels"]
        mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["next_sentence_label"])
        predicted = labels != -100
        mlm_acc = (mlm_logits.argmax(-1)[predicted] == labels[predicted]).float().mean()
        nsp_acc = (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
        return {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
                "mlm_acc": mlm_acc, "nsp_acc": nsp_acc}

    def _log(self, split: str, out: dict, batch_size: int) -> None:
        metrics = {f"{split}/{k}": v.detach() for k, v in out.items() if k != "loss"}
        metrics[f"{split}/mlm_perplexity"] = torch.exp(out["mlm_loss"].detach().clamp(max=50))
        on_step = split == "train"
        self.log_dict(metrics, on_step=on_step, on_epoch=not on_step, batch_size=batch_size)
        self.log(f"{split}/loss", out["loss"].detach(), prog_bar=True, on_step=on_step, on_epoch=not on_step,
                 batch_size=batch_size)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model_step(batch)
        if not torch.isfinite(out["loss"]):
            raise FloatingPointError(f"pretraining loss is {out['loss'].item()} at step {self.global_step}; "
                                     "lower pretrain.lr or raise pretrain.warmup_steps")
        self._log("train", out, batch["input_ids"].shape[0])
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._log("val", self.model_step(batch), batch["input_ids"].shape[0])

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_with_linear_schedule(self.model, hp.lr, hp.weight_decay, hp.betas, hp.warmup_steps,
                                          hp.max_steps)


def resolve_precision(precision: str) -> str:
    """`auto`: bf16 autocast where the CPU computes bf16 natively (AMX or AVX512-BF16), else fp32."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    return "bf16-mixed" if native else "32-true"
