"""BERT's pretraining objectives as a LightningModule: masked LM + next sentence prediction on a
`models.bert.BertForPreTraining` (Devlin et al. 2019, §3.1), or ELECTRA's replaced-token detection on a
`models.electra.ElectraForPreTraining` (Clark et al. 2020)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models import IGNORE_INDEX
from pipeline.engine.module import OptimizerSettings, PretrainModule


def bert_pretraining_losses(model: nn.Module, batch: dict, next_sentence_prediction: bool = True) -> dict:
    """Masked LM (+ next sentence prediction) losses and accuracies of a `BertForPreTraining` on one batch. Without
    NSP the loss is the MLM loss alone (RoBERTa, Liu et al. 2019 §4.2; Cramming, Geiping & Goldstein 2023): the
    NSP head is still scored, so its accuracy shows it learned nothing."""
    mlm_logits, nsp_logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                   mlm_positions=batch["mlm_positions"])
    labels = batch["mlm_labels"]
    mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
    nsp_loss = F.cross_entropy(nsp_logits.float(), batch["next_sentence_label"])
    predicted = labels != IGNORE_INDEX
    mlm_acc = (mlm_logits.argmax(-1)[predicted] == labels[predicted]).float().mean()
    nsp_acc = (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
    return {"loss": mlm_loss + nsp_loss if next_sentence_prediction else mlm_loss, "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss, "mlm_acc": mlm_acc, "nsp_acc": nsp_acc}


def electra_pretraining_losses(model: nn.Module, batch: dict, discriminator_weight: float) -> dict:
    """ELECTRA's loss (Clark et al. 2020, eq. 1): the generator's masked-LM loss plus `discriminator_weight` (their
    lambda = 50) times replaced-token detection over every real token. mlm_loss/mlm_acc are the generator's, so the
    unigram-plateau diagnostics read the same as for masked LM."""
    mlm_logits, rtd_logits, replaced = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                             batch["mlm_positions"], batch["mlm_labels"])
    labels = batch["mlm_labels"]
    mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
    real = batch["attention_mask"].bool()
    rtd_logits, replaced = rtd_logits[real].float(), replaced[real]
    rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits, replaced.float())
    predicted = labels != IGNORE_INDEX
    return {"loss": mlm_loss + discriminator_weight * rtd_loss, "mlm_loss": mlm_loss, "rtd_loss": rtd_loss,
            "mlm_acc": (mlm_logits.argmax(-1)[predicted] == labels[predicted]).float().mean(),
            "rtd_acc": ((rtd_logits > 0) == replaced).float().mean(),
            "replaced_fraction": replaced.float().mean()}


class BertPretrainModule(PretrainModule):
    """Masked LM + next sentence prediction (Devlin et al. 2019, §3.1) on a `BertForPreTraining`, or with
    objective="electra" replaced-token detection on an `ElectraForPreTraining`."""

    def __init__(self, model: nn.Module, optimizer: OptimizerSettings, next_sentence_prediction: bool = True,
                 objective: str = "mlm", discriminator_weight: float = 50.0):
        super().__init__(model, optimizer, next_sentence_prediction=next_sentence_prediction, objective=objective,
                         discriminator_weight=discriminator_weight)

    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        if self.hparams.objective == "electra":
            out = electra_pretraining_losses(self.model, batch, self.hparams.discriminator_weight)
        else:
            out = bert_pretraining_losses(self.model, batch, self.hparams.next_sentence_prediction)
        return {**out, "mlm_perplexity": torch.exp(out["mlm_loss"].detach().clamp(max=50))}
