"""Fine-tuning LightningModules for every task family: sentence(-pair) classification and regression (GLUE), token
classification (CoNLL-2003 NER) and extractive QA (SQuAD v1.1), the heads of BERT's Figure 4 (Devlin et al. 2019),
plus their batch collators.

Each module has one `model_step` for train and dev, scores dev with pipeline/evaluation/metrics.py at epoch end, and
exposes the last dev scores as `scores`."""
from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data_prep.tasks.conll import word_level_tags
from data_prep.tasks.squad import SquadExample, best_answers
from models import IGNORE_INDEX
from pipeline.engine.module import check_finite_loss
from pipeline.engine.optim import adamw_with_schedule
from pipeline.evaluation.metrics import score_task


def pad_right(sequences: Sequence[np.ndarray], value: int) -> torch.Tensor:
    """Right-padded (B, T) int64 ids."""
    padded = torch.full((len(sequences), max(len(s) for s in sequences)), value, dtype=torch.long)
    for i, sequence in enumerate(sequences):
        padded[i, : len(sequence)] = torch.as_tensor(sequence)
    return padded


def collate_token_classification(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Features of data_prep.tasks.conll.encode_tagged_sentences -> a padded batch (padding labels are ignored)."""
    input_ids = pad_right([r["input_ids"] for r in rows], pad_id)
    return {"input_ids": input_ids, "token_type_ids": pad_right([r["token_type_ids"] for r in rows], 0),
            "attention_mask": (input_ids != pad_id).long(),
            "labels": pad_right([r["labels"] for r in rows], IGNORE_INDEX),
            "word_ids": pad_right([r["word_ids"] for r in rows], -1),
            "example_index": torch.tensor([r["example_index"] for r in rows])}


def collate_question_answering(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """(feature_index, feature) pairs of data_prep.tasks.squad.squad_features -> a padded batch; the index lets the
    module
    match logits back to the feature's offsets (use with `list(enumerate(features))` as the dataset)."""
    input_ids = pad_right([feature["input_ids"] for _, feature in rows], pad_id)
    return {"input_ids": input_ids, "token_type_ids": pad_right([feature["token_type_ids"] for _, feature in rows], 0),
            "attention_mask": (input_ids != pad_id).long(),
            "start_positions": torch.tensor([feature["start_position"] for _, feature in rows]),
            "end_positions": torch.tensor([feature["end_position"] for _, feature in rows]),
            "feature_index": torch.tensor([index for index, _ in rows])}


def model_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """A sentence (pair) batch without its labels: the keyword arguments of the task model's forward (BERT's
    input_ids, token_type_ids and attention_mask; the features of frozen sentence vectors for a head on them)."""
    return {key: value for key, value in batch.items() if key != "labels"}


class FinetuneModule(L.LightningModule):
    """Training step, logging and BERT's optimiser shared by the modules below and ELMo's ElmoTaskModule
    (pipeline/elmo/downstream.py); subclasses save lr, weight_decay, warmup_steps and total_steps as hyperparameters,
    and define model_step (loss first) and dev scoring."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.scores: dict[str, float] = {}
        # what the stage writes on this run's rows beside its scores (a generation task's output_summary)
        self.row_fields: dict = {}
        # whether this run's outputs (a generation task's generated/ file) are the ones its stage keeps: the stage's
        # runs may finish in any order (finetune.parallel_runs), so "the last run writes" would keep any of them
        self.keeps_outputs = True

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.model_step(batch)[0]
        check_finite_loss(loss, self.global_step, "lower finetune.lr")
        rows = next(iter(batch.values()))  # every entry of a batch is batch-first
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=rows.shape[0])
        return loss

    def _log_scores(self, scores: dict[str, float]) -> None:
        self.scores = scores
        self.log_dict({f"val/{name}": float(value) for name, value in scores.items()}, prog_bar=True)

    # finetune.encoder_lr_factor: the task model's pretrained `encoder` trains at this factor x the head's lr;
    # finetune.layer_lr_decay: and each of its layers at this factor x the rate of the layer above (a head on a frozen
    # encoder, which has no `encoder` to train, ignores both)
    encoder_lr_factor: float = 1.0
    layer_lr_decay: float = 1.0

    def configure_optimizers(self):
        hp = self.hparams
        encoder = getattr(self.model, "encoder", None)
        scales = {} if encoder is None else encoder_lr_scales(encoder, self.encoder_lr_factor, self.layer_lr_decay)
        return adamw_with_schedule(self.model, hp.lr, hp.weight_decay, (0.9, 0.999), hp.warmup_steps,
                                   hp.total_steps, lr_scales=scales)


def layer_depths(encoder: nn.Module) -> dict[str, int]:
    """Parameter name -> depth in a layered encoder: 0 for what comes before the first numbered layer (embeddings),
    i + 1 for the parameters of layer i (a name with a number in it: BERT's encoder.layer.3, GPT's h.3), and the
    number of layers + 1 for what follows the last (BERT's pooler, GPT's final LayerNorm)."""
    names = [name for name, _ in encoder.named_parameters()]
    layer = {name: next((int(part) for part in name.split(".") if part.isdigit()), None) for name in names}
    layers = [i for i in layer.values() if i is not None]
    top = max(layers, default=-1) + 2
    first = next((k for k, name in enumerate(names) if layer[name] is not None), len(names))
    return {name: layer[name] + 1 if layer[name] is not None else (0 if k < first else top)
            for k, name in enumerate(names)}


def encoder_lr_scales(encoder: nn.Module, factor: float, decay: float) -> dict[int, float]:
    """id(parameter) -> its factor of the head's learning rate: `factor`, times `decay` per layer below the encoder's
    top (ULMFiT's discriminative fine-tuning, Howard & Ruder 2018; ELECTRA's layer-wise decay, Clark et al. 2020):
    the general features of the lower layers move least."""
    depths = layer_depths(encoder)
    top = max(depths.values(), default=0)
    parameters = dict(encoder.named_parameters())
    return {id(parameters[name]): factor * decay ** (top - depth) for name, depth in depths.items()
            if factor * decay ** (top - depth) != 1.0}


class ClassificationModule(FinetuneModule):
    """BertForSequenceClassification with cross-entropy on the [CLS] head; dev scored by the task's metric
    (accuracy, MRPC's accuracy and F1, CoLA's Matthews correlation)."""

    def __init__(self, model: nn.Module, metric: str, lr: float, weight_decay: float, warmup_steps: int,
                 total_steps: int):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model"])
        self._predictions, self._references = [], []

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(**model_inputs(batch))
        return F.cross_entropy(logits.float(), batch["labels"]), logits.argmax(-1)

    def on_validation_epoch_start(self) -> None:
        self._predictions, self._references = [], []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, predictions = self.model_step(batch)
        self._predictions += predictions.tolist()
        self._references += batch["labels"].tolist()
        self.log("val/loss", loss.detach(), on_epoch=True, batch_size=batch["labels"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self._log_scores(score_task(self.hparams.metric, self._predictions, self._references))


class RegressionModule(FinetuneModule):
    """A one-output BertForSequenceClassification trained with mean squared error (STS-B, BERT Sec. 4.1); dev
    Pearson and Spearman correlation."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, warmup_steps: int, total_steps: int):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model"])
        self._predictions, self._references = [], []

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if not batch["labels"].is_floating_point():
            raise TypeError("regression labels arrived as integers, so scores were truncated; collate them as "
                            "float tensors")
        predictions = self.model(**model_inputs(batch)).squeeze(-1)
        return F.mse_loss(predictions.float(), batch["labels"].float()), predictions

    def on_validation_epoch_start(self) -> None:
        self._predictions, self._references = [], []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, predictions = self.model_step(batch)
        self._predictions += predictions.float().tolist()
        self._references += batch["labels"].float().tolist()
        self.log("val/loss", loss.detach(), on_epoch=True, batch_size=batch["labels"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self._log_scores(score_task("pearson_spearman", self._predictions, self._references))


class TokenClassificationModule(FinetuneModule):
    """BertForTokenClassification with cross-entropy on each word's first sub-token (BERT Sec. 5.3); dev scored
    over words by the task's `metric` (entity_f1: conlleval's chunk precision/recall/F1; token_accuracy), against
    `dev_tags`, the gold word tags of the dev sentences."""

    def __init__(self, model: nn.Module, labels: Sequence[str], dev_tags: Sequence[Sequence[str]], lr: float,
                 weight_decay: float, warmup_steps: int, total_steps: int, metric: str = "entity_f1"):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model", "dev_tags"])
        self.labels, self.dev_tags = list(labels), dev_tags
        self._predicted_tags: dict[int, list[str]] = {}

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        return loss, logits.argmax(-1)

    def on_validation_epoch_start(self) -> None:
        self._predicted_tags = {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, predictions = self.model_step(batch)
        for row_predictions, word_ids, example in zip(predictions.tolist(), batch["word_ids"].tolist(),
                                                      batch["example_index"].tolist()):
            self._predicted_tags[example] = word_level_tags(row_predictions, word_ids, self.labels,
                                                            len(self.dev_tags[example]))
        self.log("val/loss", loss.detach(), on_epoch=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        examples = sorted(self._predicted_tags)
        self._log_scores(score_task(self.hparams.metric, [self._predicted_tags[i] for i in examples],
                                    [self.dev_tags[i] for i in examples]))


class QuestionAnsweringModule(FinetuneModule):
    """BertForQuestionAnswering with the mean of start and end cross-entropy (BERT's run_squad.py); dev exact match
    and F1 of the best span over each question's windows (`dev_features` from squad_features on `dev_examples`)."""

    def __init__(self, model: nn.Module, dev_examples: Sequence[SquadExample], dev_features: Sequence[dict],
                 n_best_size: int, max_answer_length: int, lr: float, weight_decay: float, warmup_steps: int,
                 total_steps: int):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model", "dev_examples", "dev_features"])
        self.dev_examples, self.dev_features = dev_examples, dev_features
        self._start_logits: dict[int, np.ndarray] = {}
        self._end_logits: dict[int, np.ndarray] = {}

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start_logits, end_logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        loss = (F.cross_entropy(start_logits.float(), batch["start_positions"])
                + F.cross_entropy(end_logits.float(), batch["end_positions"])) / 2
        return loss, start_logits, end_logits

    def on_validation_epoch_start(self) -> None:
        self._start_logits, self._end_logits = {}, {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, start_logits, end_logits = self.model_step(batch)
        lengths = batch["attention_mask"].sum(-1).tolist()
        for row, (feature_index, length) in enumerate(zip(batch["feature_index"].tolist(), lengths)):
            self._start_logits[feature_index] = start_logits[row, :length].float().cpu().numpy()
            self._end_logits[feature_index] = end_logits[row, :length].float().cpu().numpy()
        self.log("val/loss", loss.detach(), on_epoch=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        answers = best_answers(self.dev_examples, self.dev_features, self._start_logits, self._end_logits,
                               self.hparams.n_best_size, self.hparams.max_answer_length)
        answered = [e for e in self.dev_examples if e.qas_id in answers]
        self._log_scores(score_task("squad", [answers[e.qas_id] for e in answered], [e.answers for e in answered]))
