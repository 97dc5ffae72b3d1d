"""BERT's pretraining objectives as a LightningModule: masked LM + next sentence prediction on a
`models.bert.BertForPreTraining` (Devlin et al. 2019, §3.1), masked LM + a contrastive loss between a pair's segments,
or ELECTRA's replaced-token detection on a
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
    mlm_acc = _accuracy(mlm_logits, labels)
    nsp_acc = (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
    return {"loss": mlm_loss + nsp_loss if next_sentence_prediction else mlm_loss, "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss, "mlm_acc": mlm_acc, "nsp_acc": nsp_acc}


def contrastive_pretraining_losses(model: nn.Module, batch: dict, weight: float, temperature: float) -> dict:
    """Masked LM plus `weight` times a contrastive loss between the segments of each pair, encoded apart (the
    collator's split_segments: rows 0..n-1 the first segments, n..2n-1 the second): each first segment's mean-pooled
    state, cosine-compared at `temperature`, must pick its own second segment among the batch's, and back (InfoNCE,
    symmetric as in CLIP). Only pairs whose second segment continues the first (next_sentence_label 0, HF's
    convention) are positives; the random ones still serve as negatives."""
    sequence_output, _ = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])  # (2n, T, H)
    index = batch["mlm_positions"].unsqueeze(-1).expand(-1, -1, sequence_output.size(-1))  # (2n, P, H)
    mlm_logits = model.cls.predictions(sequence_output.gather(1, index))  # (2n, P, V)
    labels = batch["mlm_labels"]
    mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (2n, T, 1)
    pooled = F.normalize((sequence_output.float() * mask).sum(1) / mask.sum(1), dim=-1)  # (2n, H), the mean pooling
    first, second = pooled.chunk(2)  # (n, H) each
    similarity = first @ second.T / temperature  # (n, n)
    positive = batch["next_sentence_label"] == 0
    targets = torch.arange(len(first), device=similarity.device)[positive]
    if not positive.any():  # a batch of random pairs only (e.g. a short last held-out batch) has nothing to find
        return {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_acc": _accuracy(mlm_logits, labels)}
    contrastive_loss = (F.cross_entropy(similarity[positive], targets)
                        + F.cross_entropy(similarity.T[positive], targets)) / 2
    return {"loss": mlm_loss + weight * contrastive_loss, "mlm_loss": mlm_loss, "contrastive_loss": contrastive_loss,
            "mlm_acc": _accuracy(mlm_logits, labels),
            "contrastive_acc": (similarity[positive].argmax(-1) == targets).float().mean()}


def _accuracy(mlm_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    predicted = labels != IGNORE_INDEX
    return (mlm_logits.argmax(-1)[predicted] == labels[predicted]).float().mean()


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
    return {"loss": mlm_loss + discriminator_weight * rtd_loss, "mlm_loss": mlm_loss, "rtd_loss": rtd_loss,
            "mlm_acc": _accuracy(mlm_logits, labels),
            "rtd_acc": ((rtd_logits > 0) == replaced).float().mean(),
            "replaced_fraction": replaced.float().mean()}


class BertPretrainModule(PretrainModule):
    """Masked LM + next sentence prediction (Devlin et al. 2019, §3.1) on a `BertForPreTraining`, or with
    objective="electra" replaced-token detection on an `ElectraForPreTraining`."""

    def __init__(self, model: nn.Module, optimizer: OptimizerSettings, next_sentence_prediction: bool = True,
                 objective: str = "mlm", discriminator_weight: float = 50.0, contrastive_weight: float = 0.0,
                 contrastive_temperature: float = 0.05):
        super().__init__(model, optimizer, next_sentence_prediction=next_sentence_prediction, objective=objective,
                         discriminator_weight=discriminator_weight, contrastive_weight=contrastive_weight,
                         contrastive_temperature=contrastive_temperature)

    def model_step(self, batch: dict) -> dict[str, torch.Tensor]:
        if self.hparams.objective == "electra":
            out = electra_pretraining_losses(self.model, batch, self.hparams.discriminator_weight)
        elif self.hparams.contrastive_weight > 0:
            out = contrastive_pretraining_losses(self.model, batch, self.hparams.contrastive_weight,
                                                 self.hparams.contrastive_temperature)
        else:
            out = bert_pretraining_losses(self.model, batch, self.hparams.next_sentence_prediction)
        return {**out, "mlm_perplexity": torch.exp(out["mlm_loss"].detach().clamp(max=50))}
