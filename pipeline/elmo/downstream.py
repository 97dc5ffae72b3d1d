"""ELMo used feature-based on the downstream tasks (Peters et al. 2018, §3.3): the frozen biLM, a trainable scalar mix
and a small task head, which reads [word vectors; ELMo] (finetune.elmo_word_vectors): `finetune.models=[elmo]`, with
it (finetune.random_twins) `elmo_random`, the same with the biLM randomly initialised, and (finetune.controls)
`elmo_w2v`, the same head on the word vectors alone: the task model without ELMo, which the paper's gains are over."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from data_prep.corpus.word_vectors import WordVectors
from data_prep.examples.elmo_examples import elmo_words, read_word_vocab
from models import IGNORE_INDEX
from models.checkpoint import random_twin
from models.elmo import (
    ElmoEmbedder,
    ElmoSentenceClassifier,
    ElmoTokenTagger,
    MixSettings,
    load_pretrained,
    sentence_batch_inputs,
)
from pipeline.data_settings import chinese_words_of
from pipeline.downstream.modules import FinetuneModule
from pipeline.downstream.settings import FinetuneConfig, finetune_settings
from pipeline.downstream.task_data import TaskData, conll_splits, majority_tag_scores, tsv_splits
from pipeline.downstream.tasks import TaskSplit
from pipeline.downstream.word2vec import WORD2VEC, load_word2vec
from pipeline.elmo.settings import ElmoFinetuneConfig, WordVectorSource
from pipeline.engine.dag import StageContext
from pipeline.engine.family import FinetuneKind
from pipeline.engine.settings import typed_settings
from pipeline.evaluation.metrics import score_task


@dataclass
class ElmoTaskModels:
    """What the task heads read, loaded once and shared by every task and seed, both frozen (only the mix and the
    head are new): the run's biLM (None: the task model without ELMo) and the task model's word vectors, one row per
    word of the biLM's vocabulary `vocab` (None: ELMo alone). Every head mixes the biLM's layers as `mix` says."""
    bilm: nn.Module | None
    vocab: list[str]
    word_vectors: torch.Tensor | None
    encoding_key: str
    dropout: float  # finetune.elmo_dropout: in the sentence classifiers' output layers
    mix: MixSettings
    chinese_words: str = "jieba"  # data.chinese_words: how the vocabulary's words were split

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        return load_elmo_task_data(task, data_dir, self, finetune.max_train_examples, seed, selection_fraction)

    def build(self, data: TaskData) -> nn.Module:
        return data.make_model(None)


def vocab_vectors(vocab: Sequence[str], vectors: WordVectors) -> np.ndarray:
    """(len(vocab), d) float32: the vector of each word of the biLM's vocabulary, zeros where `vectors` has none
    (the special words among them). Looked up lower-cased: the word2vec stage's words are (its tokenize), where the
    biLM's keep their case for the char-CNN."""
    out = np.zeros((len(vocab), vectors.vectors.shape[1]), dtype=np.float32)
    for i, word in enumerate(vocab):
        if (row := vectors.index.get(word.lower())) is not None:
            out[i] = vectors.vectors[row]
    return out


def reads_word_vectors(cfg: DictConfig) -> bool:
    """Whether the heads of `elmo` and `elmo_random` read the word2vec stage's vectors beside the mix."""
    return typed_settings(cfg.finetune, ElmoFinetuneConfig).elmo_word_vectors == WordVectorSource.word2vec


def mix_settings(settings: ElmoFinetuneConfig) -> MixSettings:
    """How every ELMo head of the run mixes the biLM's layers (finetune.elmo_*)."""
    mix_dropout = settings.elmo_dropout if settings.elmo_mix_dropout is None else settings.elmo_mix_dropout
    return MixSettings(settings.elmo_layer_norm, settings.elmo_gamma_init, mix_dropout)


def _task_models(ctx: StageContext, bilm: nn.Module | None, encoding_key: str, word_vectors: bool) -> ElmoTaskModels:
    vocab = read_word_vocab(ctx.stage_dir("elmo_vocab") / "vocab.txt")
    vectors = (torch.from_numpy(vocab_vectors(vocab, load_word2vec(ctx.stage_dir(WORD2VEC.name))))
               if word_vectors else None)
    settings = typed_settings(ctx.cfg.finetune, ElmoFinetuneConfig)
    return ElmoTaskModels(bilm, vocab, vectors, encoding_key, settings.elmo_dropout, mix_settings(settings),
                          chinese_words_of(ctx.cfg))


def _load(random_init: bool):
    """The run's biLM, or (random_init) its randomly initialised twin, the baseline its features must beat."""
    def load(ctx: StageContext) -> ElmoTaskModels:
        bilm_dir = ctx.stage_dir("elmo_pretrain") / "bilm"
        bilm = load_pretrained(bilm_dir)
        if random_init:
            bilm = random_twin(bilm, ctx.cfg.seed)
        return _task_models(ctx, bilm.eval(), f"{bilm_dir}{' random' if random_init else ''}",
                            reads_word_vectors(ctx.cfg))
    return load


# `elmo`'s control (FinetuneKind.control) where its heads read word vectors
CONTROL = "elmo_w2v"


def _control(ctx: StageContext) -> ElmoTaskModels:
    """elmo_w2v: the heads on the word vectors alone, no biLM."""
    return _task_models(ctx, None, f"{ctx.stage_dir(WORD2VEC.name)} over {ctx.stage_dir('elmo_vocab')}", True)


def _control_of_elmo(cfg: DictConfig) -> str:
    """`elmo`'s control: elmo_w2v where the heads read word vectors beside the mix (the task model without ELMo),
    else the random twin (the same heads on a biLM without pretraining)."""
    return CONTROL if reads_word_vectors(cfg) else "elmo_random"


def check_control(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: elmo_w2v only where `elmo`'s heads read the word vectors too, where it is the control;
    elsewhere they read the mix alone, and elmo_w2v would be another task model, not `elmo`'s without ELMo."""
    if "finetune" in stages and CONTROL in finetune_settings(cfg).models and not reads_word_vectors(cfg):
        raise ValueError(f"finetune.models has {CONTROL}, the control of ELMo heads that read word vectors beside the "
                         "mix, and finetune.elmo_word_vectors=none; remove it from finetune.models, or set "
                         "finetune.elmo_word_vectors=word2vec")


def _bilm_stages(cfg: DictConfig) -> tuple[str, ...]:
    return ("elmo_vocab", "elmo_pretrain") + ((WORD2VEC.name,) if reads_word_vectors(cfg) else ())


FINETUNE_KINDS = {"elmo": FinetuneKind(_bilm_stages, _load(random_init=False), random_twin="elmo_random",
                                       control=_control_of_elmo),
                  "elmo_random": FinetuneKind(_bilm_stages, _load(random_init=True)),
                  # without elmo_pretrain: the control waits for no pretraining
                  CONTROL: FinetuneKind(lambda cfg: ("elmo_vocab", WORD2VEC.name), _control)}


def load_elmo_task_data(task: DictConfig, data_dir: Path, models: ElmoTaskModels, max_train_examples: int | None,
                        seed: int, selection_fraction: float | None = None) -> TaskData:
    """One task as rows of words for the heads of `models`: a tsv task's texts split as the biLM's vocabulary was
    (data_prep.examples.elmo_examples.elmo_words, Chinese by `models.chinese_words`), a conll task's words as they
    are; the heads are ElmoTaskModule's, mixing the biLM's layers as `models.mix` says, with `models.dropout` in the
    sentence classifiers' output layers."""
    bilm, vocab, vectors, dropout, mix = models.bilm, models.vocab, models.word_vectors, models.dropout, models.mix
    collate = make_elmo_task_collate(None if bilm is None else ElmoEmbedder(bilm, vocab),
                                     None if vectors is None else vocab)
    if task.format == "tsv":
        train, dev, majority_scores = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        pair, regression = train.texts_b is not None, task.labels is None

        def rows(split: TaskSplit) -> list[dict]:
            return [{"text_a": elmo_words(split.texts_a[i], models.chinese_words), "label": split.labels[i],
                     **({"text_b": elmo_words(split.texts_b[i], models.chinese_words)} if pair else {})}
                    for i in range(len(split.labels))]

        return TaskData(rows(train), rows(dev), collate,
                        lambda _: ElmoSentenceClassifier(bilm, 1 if regression else len(task.labels), pair=pair,
                                                         vocab=vocab, dropout=dropout, word_vectors=vectors,
                                                         mix=mix),
                        partial(ElmoTaskModule, metric="pearson_spearman" if regression else task.metric),
                        majority_scores, None if regression else train.labels)
    if task.format == "conll":
        labels = list(task.labels)
        index = {tag: i for i, tag in enumerate(labels)}

        def rows(sentences) -> list[dict]:
            return [{"text_a": s.tokens, "label": [index[t] for t in s.tags]} for s in sentences]

        train, dev = conll_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        return TaskData(rows(train), rows(dev), collate,
                        lambda _: ElmoTokenTagger(bilm, len(labels), vocab=vocab, word_vectors=vectors, mix=mix),
                        partial(ElmoTaskModule, metric=task.metric, labels=labels),
                        majority_tag_scores(task, train, dev))
    raise ValueError(f"task {task.name}: ELMo's feature-based heads take tsv (classification, pairs, regression) "
                     f"and conll (tagging) tasks, not {task.format!r}; drop elmo from finetune.models for it")


def make_elmo_task_collate(embedder: ElmoEmbedder | None, vocab: list[str] | None = None):
    """collate_fn for rows {"text_a", optional "text_b", "label"}: a label per sentence (int class, or float score)
    or per word (list of ints, padded with IGNORE_INDEX); text as raw text (words as
    `conventions.elmo_words.split_words` splits them) or as a list of words. Each text as the biLM's `inputs` (of
    `embedder`; none without a biLM) and as the `word_ids` of `vocab` (the rows of the heads' word vectors; none
    without them), both wrapped in <S> ... </S> under one `mask`; a pair's second text with the prefix pair_."""
    word_index = None if vocab is None else {w: i for i, w in enumerate(vocab)}

    def sides(sentences: list) -> dict[str, torch.Tensor]:
        side = {}
        if embedder is not None:
            side["inputs"], side["mask"] = embedder.batch_inputs(sentences)
        if word_index is not None:
            side["word_ids"], side["mask"] = map(torch.from_numpy, sentence_batch_inputs(sentences, word_index))
        return side

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = sides([r["text_a"] for r in rows])
        if "text_b" in rows[0]:
            batch.update({f"pair_{key}": value for key, value in sides([r["text_b"] for r in rows]).items()})
        if isinstance(rows[0]["label"], (int, float)):  # a class id, or a score to regress
            dtype = torch.long if isinstance(rows[0]["label"], int) else torch.float32
            batch["labels"] = torch.tensor([r["label"] for r in rows], dtype=dtype)
        else:
            labels = torch.full((len(rows), batch["mask"].shape[1] - 2), IGNORE_INDEX, dtype=torch.long)
            for i, r in enumerate(rows):
                labels[i, : len(r["label"])] = torch.as_tensor(r["label"])
            batch["labels"] = labels
        return batch

    return collate


class ElmoTaskModule(FinetuneModule):
    """Feature-based use of a frozen biLM and frozen word vectors (Peters et al. §3.3): only the scalar mix and the
    head train. The fine-tune stage's three task families: sentences or pairs classified (`ElmoSentenceClassifier`,
    cross-entropy), a one-output classifier regressed with mean squared error (STS-B), and words tagged
    (`ElmoTokenTagger`, labels per word, IGNORE_INDEX skipped). Dev is scored by `metric`
    (pipeline.evaluation.metrics.score_task); tagging needs the tag names `labels`, to score the words' tags (entity
    F1, token accuracy)."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, warmup_steps: int, total_steps: int,
                 metric: str = "accuracy", labels: Sequence[str] | None = None):
        super().__init__(model)
        self.save_hyperparameters(ignore=["model"])
        self._predictions, self._references = [], []

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, predictions): label ids, or scores for regression."""
        labels = batch["labels"]
        if labels.dim() == 2:  # tagging
            logits, _ = self.model(batch.get("inputs"), batch["mask"], batch.get("word_ids"))
            loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
            return loss, logits.argmax(-1)
        logits = self.model(batch.get("inputs"), batch["mask"], batch.get("pair_inputs"), batch.get("pair_mask"),
                            batch.get("word_ids"), batch.get("pair_word_ids"))
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
