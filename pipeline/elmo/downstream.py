"""ELMo used feature-based on the downstream tasks (Peters et al. 2018, §3.3): the frozen biLM, a trainable scalar mix
and a small task head; `finetune.models=[elmo]`, and with it (finetune.random_twins) `elmo_random`, the same with the
biLM randomly initialised."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from data_prep.examples.elmo_examples import elmo_words, read_word_vocab
from models import IGNORE_INDEX
from models.checkpoint import random_twin
from models.elmo import ElmoEmbedder, ElmoSentenceClassifier, ElmoTokenTagger, load_pretrained
from pipeline.data_settings import chinese_words_of
from pipeline.downstream.modules import FinetuneModule
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.task_data import TaskData, conll_sentences, majority_tag_scores, subsample, tsv_splits
from pipeline.downstream.tasks import TaskSplit
from pipeline.elmo.settings import ElmoFinetuneConfig
from pipeline.engine.dag import StageContext
from pipeline.engine.family import FinetuneKind
from pipeline.engine.settings import typed_settings
from pipeline.evaluation.metrics import score_task


@dataclass
class ElmoTaskModels:
    """The run's biLM, loaded once and shared by every task and seed: it is frozen, only the mix and head are new."""
    bilm: nn.Module
    vocab: list[str]
    encoding_key: str
    dropout: float  # finetune.elmo_dropout
    chinese_words: str = "jieba"  # data.chinese_words: how the vocabulary's words were split

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        return load_elmo_task_data(task, data_dir, (self.bilm, self.vocab), finetune.max_train_examples, seed,
                                   selection_fraction, self.chinese_words, dropout=self.dropout)

    def build(self, data: TaskData) -> nn.Module:
        return data.make_model(None)


def _load(random_init: bool):
    """The run's biLM, or (random_init) its randomly initialised twin, the baseline its features must beat."""
    def load(ctx: StageContext) -> ElmoTaskModels:
        bilm_dir = ctx.stage_dir("elmo_pretrain") / "bilm"
        bilm = load_pretrained(bilm_dir)
        if random_init:
            bilm = random_twin(bilm, ctx.cfg.seed)
        return ElmoTaskModels(bilm.eval(), read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt"),
                              f"{bilm_dir}{' random' if random_init else ''}",
                              typed_settings(ctx.cfg.finetune, ElmoFinetuneConfig).elmo_dropout,
                              chinese_words_of(ctx.cfg))
    return load


FINETUNE_KINDS = {"elmo": FinetuneKind(lambda cfg: ("elmo_vocab", "elmo_pretrain"), _load(random_init=False),
                                       random_twin="elmo_random"),
                  "elmo_random": FinetuneKind(lambda cfg: ("elmo_vocab", "elmo_pretrain"), _load(random_init=True))}


def load_elmo_task_data(task: DictConfig, data_dir: Path, bilm_and_vocab: tuple, max_train_examples: int | None,
                        seed: int, selection_fraction: float | None = None, chinese_words: str = "jieba", *,
                        dropout: float) -> TaskData:
    """One task as rows of words for the frozen biLM: a tsv task's texts split as the biLM's vocabulary was
    (data_prep.examples.elmo_examples.elmo_words, Chinese by `chinese_words`), a conll task's words as they are; the
    heads are
    ElmoTaskModule's. The biLM is loaded once and shared by every seed: it is frozen, only the mix and the head are
    built fresh. `dropout`: the heads' (on the mixed vectors and inside the head)."""
    bilm, vocab = bilm_and_vocab
    collate = make_elmo_task_collate(ElmoEmbedder(bilm, vocab))
    if task.format == "tsv":
        train, dev, majority_scores = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        pair, regression = train.texts_b is not None, task.labels is None

        def rows(split: TaskSplit) -> list[dict]:
            return [{"text_a": elmo_words(split.texts_a[i], chinese_words), "label": split.labels[i],
                     **({"text_b": elmo_words(split.texts_b[i], chinese_words)} if pair else {})}
                    for i in range(len(split.labels))]

        return TaskData(rows(train), rows(dev), collate,
                        lambda _: ElmoSentenceClassifier(bilm, 1 if regression else len(task.labels), pair=pair,
                                                         vocab=vocab, dropout=dropout),
                        partial(ElmoTaskModule, metric="pearson_spearman" if regression else task.metric),
                        majority_scores, None if regression else train.labels)
    if task.format == "conll":
        labels = list(task.labels)
        index = {tag: i for i, tag in enumerate(labels)}

        def rows(sentences) -> list[dict]:
            return [{"text_a": s.tokens, "label": [index[t] for t in s.tags]} for s in sentences]

        train = subsample(conll_sentences(task, data_dir, task.train_file), max_train_examples, seed)
        dev = conll_sentences(task, data_dir, task.dev_file)
        return TaskData(rows(train), rows(dev), collate, lambda _: ElmoTokenTagger(bilm, len(labels), vocab=vocab,
                                                                         dropout=dropout),
                        partial(ElmoTaskModule, metric=task.metric, labels=labels),
                        majority_tag_scores(task, train, dev))
    raise ValueError(f"task {task.name}: ELMo's feature-based heads take tsv (classification, pairs, regression) "
                     f"and conll (tagging) tasks, not {task.format!r}; drop elmo from finetune.models for it")


def make_elmo_task_collate(embedder: ElmoEmbedder):
    """collate_fn for rows {"text_a", optional "text_b", "label"}: a label per sentence (int class, or float score)
    or per word (list of ints, padded with IGNORE_INDEX); text as raw text (words as
    `conventions.elmo_words.split_words` splits them) or as a list of words."""

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        inputs, mask = embedder.batch_inputs([r["text_a"] for r in rows])
        batch = {"inputs": inputs, "mask": mask}
        if "text_b" in rows[0]:
            batch["pair_inputs"], batch["pair_mask"] = embedder.batch_inputs([r["text_b"] for r in rows])
        if isinstance(rows[0]["label"], (int, float)):  # a class id, or a score to regress
            dtype = torch.long if isinstance(rows[0]["label"], int) else torch.float32
            batch["labels"] = torch.tensor([r["label"] for r in rows], dtype=dtype)
        else:
            labels = torch.full((len(rows), mask.shape[1] - 2), IGNORE_INDEX, dtype=torch.long)
            for i, r in enumerate(rows):
                labels[i, : len(r["label"])] = torch.as_tensor(r["label"])
            batch["labels"] = labels
        return batch

    return collate


class ElmoTaskModule(FinetuneModule):
    """Feature-based use of a frozen biLM (Peters et al. §3.3): only the scalar mix and the head train. The fine-tune
    stage's three task families: sentences or pairs classified (`ElmoSentenceClassifier`, cross-entropy), a
    one-output classifier regressed with mean squared error (STS-B), and words tagged (`ElmoTokenTagger`, labels per
    word, IGNORE_INDEX skipped). Dev is scored by `metric` (pipeline.evaluation.metrics.score_task); tagging needs the
    tag names `labels`, to score the words' tags (entity F1, token accuracy)."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, warmup_steps: int, total_steps: int,
                 metric: str = "accuracy", labels: Sequence[str] | None = None):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model"])
        self._predictions, self._references = [], []

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, predictions): label ids, or scores for regression."""
        labels = batch["labels"]
        if labels.dim() == 2:  # tagging
            logits, _ = self.model(batch["inputs"], batch["mask"])
            loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
            return loss, logits.argmax(-1)
        logits = self.model(batch["inputs"], batch["mask"], batch.get("pair_inputs"), batch.get("pair_mask"))
        if labels.is_floating_point():
            scores = logits.squeeze(-1)
            return F.mse_loss(scores.float(), labels), scores
        return F.cross_entropy(logits.float(), labels), logits.argmax(-1)

    def on_validation_epoch_start(self) -> None:
        self._predictions, self._references = [], []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, predictions = self.model_step(batch)
        labels = batch["labels"]
        if labels.dim() == 2:
            names = self.hparams.labels
            for predicted, gold in zip(predictions.tolist(), labels.tolist()):
                words = [i for i, tag in enumerate(gold) if tag != IGNORE_INDEX]
                self._predictions.append([names[predicted[i]] for i in words])
                self._references.append([names[gold[i]] for i in words])
        else:
            self._predictions += predictions.float().tolist() if labels.is_floating_point() else predictions.tolist()
            self._references += labels.tolist()
        self.log("val/loss", loss.detach(), on_epoch=True, batch_size=labels.shape[0])

    def on_validation_epoch_end(self) -> None:
        self._log_scores(score_task(self.hparams.metric, self._predictions, self._references))
