"""SentEval-style evaluation of frozen sentence encoders (Conneau & Kiela 2018, facebookresearch/SentEval; seed 000).

The encoder protocol is SentEval's: an encoder is any object with

    name: str                                            row label in the results table
    prepare(samples: list[list[str]]) -> None            called once per task with every tokenised sentence the
                                                         task will ask for (all splits, both sides of pairs), e.g.
                                                         to build a task vocabulary; may do nothing
    batcher(batch: list[list[str]]) -> np.ndarray        (B, D) float embeddings, row i for sentence batch[i]; D is
                                                         the same for every batch; sentences may be empty lists

Sentences arrive lowercased and tokenised (data_prep.tasks.senteval_data.tokenize). As in SentEval, each distinct
sentence
is embedded once and batches are formed from sentences sorted by length, so a batch needs little padding; the encoder
must therefore return the same vector for a sentence whatever batch it is in (no dropout, no batch statistics).

On top of the frozen features sits only a multinomial logistic regression (SentEval's LogReg, nhid=0), so scores
measure the representation, not the classifier:

    kind              data                              features               protocol                  metrics
    ----------------  --------------------------------  ---------------------  ------------------------  ------------
    mr, cr, subj,     one sentence, a label             u                      stratified 10-fold CV     accuracy
    mpqa, tsv
    trec              TREC train_5500 / TREC_10         u                      L2 by inner CV on train   accuracy
    sick_entailment   SICK TRAIN / TRIAL / TEST         pair features          L2 on TRIAL, test on TEST accuracy
    sick_relatedness  SICK TRAIN / TRIAL / TEST         pair features          Tai et al. 2015 (below)   pearson,
                                                                                                         spearman
    mrpc              GLUE MRPC train / dev             pair features          L2 by inner CV on train   accuracy, f1

The pair features are senteval.pair_features: [abs_diff, product] = [|u-v|, u*v] by default, as Skip-Thought
(Kiros et al. 2015) and SentEval itself feed SICK and MRPC, so scores sit beside seed 000's tables; [u, v, abs_diff,
product] is InferSent's set (Conneau et al. 2017). Each pair-task row names the set it was scored with.
The L2 strength is always chosen on data the reported score never sees: inner stratified k-fold on the training part
(SentEval's InnerKFoldClassifier), or the task's own validation split when it has one (SplitClassifier).

One file of ~560 lines: the protocol table above, each kind's features, model selection and metrics, is one unit
that keeps the scores comparable with SentEval's; its data readers are apart (data_prep/tasks/senteval_data.py),
and so is the stage (pipeline/evaluation/stage.py).
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from data_prep.corpus.word_vectors import WordVectors
from data_prep.tasks.senteval_data import (
    LabelledSentences,
    SentencePairs,
    read_cr,
    read_labelled_tsv,
    read_mpqa,
    read_mr,
    read_mrpc,
    read_sick,
    read_subj,
    read_trec,
)
from pipeline.engine.family import Encoder
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.evaluation.metrics import accuracy, binary_f1, pearson, spearman

# -----------------------------------------------------------------------------
# Encoders


class GloveBagOfWords:
    """Mean of the word vectors of a sentence's known words: SentEval's bow.py baseline (seed 000). A sentence with
    no known word gets the zero vector, as in bow.py. GloVe 6B 50-d: GloveBagOfWords(word_vectors.load_glove())."""

    def __init__(self, vectors: WordVectors, name: str = "glove_bow"):
        self.vectors = vectors
        self.name = name
        self._table: dict[str, np.ndarray] | None = None

    def prepare(self, samples: list[list[str]]) -> None:
        # As bow.py: keep only the task's words.
        known = sorted({word for sentence in samples for word in sentence if word in self.vectors})
        if not known:
            raise ValueError(f"{self.name}: no word of the task has a vector; the vectors must be keyed by "
                             "lowercased tokens as data_prep.tasks.senteval_data.tokenize produces them")
        self._table = dict(zip(known, self.vectors.rows(known).astype(np.float32)))
        self._dim = self.vectors.vectors.shape[1]

    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        if self._table is None:
            raise RuntimeError(f"{self.name}: call prepare(samples) with the task's sentences before batcher")
        out = np.zeros((len(batch), self._dim), dtype=np.float32)
        for i, sentence in enumerate(batch):
            known = [self._table[w] for w in sentence if w in self._table]
            if known:
                out[i] = np.mean(known, axis=0)
        return out



def embed(encoder: Encoder, sentences: list[list[str]], batch_size: int) -> np.ndarray:
    """(N, D) embeddings of `sentences` through encoder.batcher: each distinct sentence once, batches of sentences
    sorted by length (SentEval's engine does the same to cut padding)."""
    if not sentences:
        raise ValueError(f"encoder {encoder.name}: no sentences to embed; the task's data is empty")
    distinct = list(dict.fromkeys(map(tuple, sentences)))
    order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
    chunks = []
    for start in range(0, len(order), batch_size):
        batch = [list(distinct[i]) for i in order[start: start + batch_size]]
        vectors = np.asarray(encoder.batcher(batch), dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(batch) or (chunks and vectors.shape[1] != chunks[0].shape[1]):
            expected = f"({len(batch)}, {chunks[0].shape[1] if chunks else 'D'})"
            raise ValueError(f"encoder {encoder.name}: batcher returned shape {vectors.shape} for a batch of "
                             f"{len(batch)} sentences; it must return {expected}, one row per sentence")
        if not np.isfinite(vectors).all():
            raise ValueError(f"encoder {encoder.name}: batcher returned NaN or infinite values")
        chunks.append(vectors)
    table = np.empty((len(distinct), chunks[0].shape[1]), dtype=np.float32)
    table[order] = np.concatenate(chunks)
    index = {sentence: i for i, sentence in enumerate(distinct)}
    return table[[index[tuple(s)] for s in sentences]]


PAIR_FEATURES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "u": lambda u, v: u,
    "v": lambda u, v: v,
    "abs_diff": lambda u, v: np.abs(u - v),
    "product": lambda u, v: u * v,
}
DEFAULT_PAIR_FEATURES = ("abs_diff", "product")  # Kiros et al. 2015 and SentEval's SICK / MRPC


def check_pair_features(names) -> tuple[str, ...]:
    names = tuple(str(n) for n in names)
    unknown = [n for n in names if n not in PAIR_FEATURES]
    if not names or unknown:
        raise ValueError(f"senteval.pair_features={list(names)}: give a non-empty list of {list(PAIR_FEATURES)}, "
                         "e.g. [abs_diff, product] (SentEval) or [u, v, abs_diff, product] (InferSent)")
    return names


def pair_features(u: np.ndarray, v: np.ndarray, names: tuple[str, ...] = DEFAULT_PAIR_FEATURES) -> np.ndarray:
    """The named features of sentence pairs side by side: (N, D), (N, D) -> (N, len(names) * D)."""
    return np.concatenate([PAIR_FEATURES[name](u, v) for name in names], axis=1)


# -----------------------------------------------------------------------------
# Classifier


@dataclass
class ClassifierSettings:
    """How the logistic regression is trained and selected (`senteval.classifier`) and what a sentence-pair
    task feeds it (`pair_features`)."""
    l2_grid: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)  # SentEval's PyTorch grid (1e-5..1e-2), one stronger
    max_iter: int = 100  # L-BFGS iterations per fit (fit_softmax_regressions: one fit for many problems)
    cv_folds: int = 10  # outer folds of single-sentence tasks (SentEval's MR/CR/SUBJ/MPQA protocol)
    inner_folds: int = 5  # folds that choose the L2 strength where a task has no validation split (SentEval: 5)
    pair_features: tuple[str, ...] = DEFAULT_PAIR_FEATURES  # what a pair task feeds it (senteval.pair_features)

    @classmethod
    def from_config(cls, classifier: ClassifierConfig, pair_features=DEFAULT_PAIR_FEATURES) -> "ClassifierSettings":
        return cls(l2_grid=tuple(float(v) for v in classifier.l2_grid), max_iter=classifier.max_iter,
                   cv_folds=classifier.cv_folds, inner_folds=classifier.inner_folds,
                   pair_features=check_pair_features(pair_features))


PairFeature = StrEnum("PairFeature", {name: name for name in PAIR_FEATURES}, module=__name__)


@dataclass
class ClassifierConfig:
    """`senteval.classifier`: how the probes' logistic regression is trained and selected; the defaults, and what each
    key means, are those of the settings object it becomes (ClassifierSettings)."""
    l2_grid: list[float] = field(default_factory=lambda: list(ClassifierSettings.l2_grid))
    max_iter: int = ClassifierSettings.max_iter
    cv_folds: int = ClassifierSettings.cv_folds
    inner_folds: int = ClassifierSettings.inner_folds


@dataclass
class SentevalConfig:
    """The `senteval` block: SentEval-style evaluation of frozen encoders (Conneau & Kiela 2018). Task paths
    are relative to data_root; an absolute path is used as is. Drop a task with `~senteval.tasks.MR`, add a labelled
    TSV with e.g. +senteval.tasks.SST2='{kind: tsv, path: /data/SST-2/train.tsv, text_column: sentence, label_column:
    label}' (optional `label_names: [...]` fixes the label order; otherwise the sorted distinct labels). The rest of
    SentEval's single-sentence tasks are read from the files as downloaded (data_prep/tasks/senteval_data.py), e.g.
    +senteval.tasks.CR='{kind: cr, path: senteval/CR}', and likewise kind subj (SUBJ), mpqa (MPQA), trec (TREC):
    CR from custrev.{pos,neg} (SentEval) or Hu & Liu 2004's annotated product files (*.txt); SUBJ from
    subj.{objective,subjective} (SentEval) or Cornell's plot.tok.gt9.5000 / quote.tok.gt9.5000; MPQA from
    mpqa.{pos,neg}; TREC from train_5500.label and TREC_10.label (its own train/test split)."""
    data_root: str = "${oc.env:TEXTREP_SHARED_DATA,../shared/data}"
    batch_size: int = 128  # sentences per batcher call (SentEval's default)
    # What the classifier of a sentence-pair task (SICK, MRPC) sees of the two embeddings u and v: [abs_diff,
    # product] = [|u-v|, u*v] as Skip-Thought (Kiros et al. 2015) and SentEval, for comparison with seed 000's
    # tables; InferSent (Conneau et al. 2017) uses [u, v, abs_diff, product].
    pair_features: list[PairFeature] = field(default_factory=lambda: [
        PairFeature(name) for name in ClassifierSettings.pair_features])
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    # name -> {kind, path, ...}, the keys a kind reads (TASK_KINDS)
    tasks: dict[str, Any] = field(default_factory=lambda: {
        "MR": {"kind": "mr", "path": "senteval/MR"},
        "SICKEntailment": {"kind": "sick_entailment", "path": "senteval/SICK/SICK.txt"},
        "SICKRelatedness": {"kind": "sick_relatedness", "path": "senteval/SICK/SICK.txt"},
        "MRPC": {"kind": "mrpc", "path": "glue/MRPC"}})


@dataclass
class SoftmaxRegression:
    """Multinomial logistic regression on standardised features."""
    weight: torch.Tensor  # (D, C)
    bias: torch.Tensor  # (C,)
    mean: torch.Tensor  # (D,) training-feature mean
    scale: torch.Tensor  # (D,) training-feature standard deviation

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        x = (torch.as_tensor(features, dtype=torch.float32) - self.mean) / self.scale
        return torch.softmax(x @ self.weight + self.bias, dim=1).numpy()


# (rows of the feature matrix to fit on, L2 strength): one logistic-regression problem of a model selection
Problem = tuple[np.ndarray, float]


def fit_softmax_regressions(features: np.ndarray, targets: np.ndarray, problems: Sequence[Problem],
                            max_iter: int) -> list[SoftmaxRegression]:
    """One model per problem, each minimising the mean cross-entropy of its rows to their target distributions
    (N, C) + l2/2 * ||W||^2 on features standardised with its rows' statistics, all by one full-batch L-BFGS run.

    One-hot targets make this ordinary logistic regression; soft targets make it Tai et al.'s KL regression (the
    cross-entropy differs from KL(target || prediction) by the targets' entropy, a constant). Standardising lets one
    L2 grid suit encoders whose activations differ in scale by orders of magnitude (GloVe vs BERT hidden states).

    Why one run for many problems: a model selection fits the same features K times (SentEval's MR: 5 inner folds
    x 5 strengths per outer fold), and each fit of C = 2..5 columns is bound by reading the (N, D) features. Summed,
    the problems share that read as one (N, D) x (D, K*C) product per step. SentEval's MR protocol on (10,662, 256)
    features on this project's 2-core machine: 112.7 s as separate single-threaded fits, 27.7 s together on one
    thread, 16.2 s on two (which separate fits of a few columns could not use). The objectives are independent and
    convex, so the sum's minimiser is every problem's own minimiser; everything starts from zero, so the result is
    deterministic.
    """
    x64 = np.asarray(features, dtype=np.float64)
    centre = x64.mean(0)  # centring first keeps the per-problem means small, so float32 loses nothing to them
    x = torch.as_tensor(x64 - centre, dtype=torch.float32)  # (N, D)
    y = torch.as_tensor(targets, dtype=torch.float32)  # (N, C)
    (n, d), c, k = x.shape, y.shape[1], len(problems)
    masks = torch.zeros(n, k, dtype=torch.float64)  # (N, K) 1 where a row belongs to a problem
    for j, (rows, _) in enumerate(problems):
        masks[torch.as_tensor(rows, dtype=torch.long), j] = 1
    count = masks.sum(0)[:, None]  # (K, 1)
    xd = x.double()
    mean = masks.T @ xd / count  # (K, D)
    variance = (masks.T @ xd.square() / count - mean.square()).clamp_min(0) * count / (count - 1).clamp_min(1)
    std = variance.sqrt().float()
    scale = torch.where(std > 1e-8, std, torch.ones_like(std))  # constant features (e.g. a zero dimension)
    mean, masks, count = mean.float(), masks.float(), count.float()
    l2 = torch.tensor([strength for _, strength in problems], dtype=torch.float32)  # (K,)
    weight = torch.zeros(k, d, c, requires_grad=True)  # standardised coordinates, where the L2 applies
    bias = torch.zeros(k, c, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, history_size=10,
                                  line_search_fn="strong_wolfe")

    def raw_coordinates() -> tuple[torch.Tensor, torch.Tensor]:
        raw_weight = weight / scale[:, :, None]  # (K, D, C)
        return raw_weight, bias - (mean[:, :, None] * raw_weight).sum(1)  # (K, D, C), (K, C)

    def closure():
        optimizer.zero_grad()
        raw_weight, raw_bias = raw_coordinates()
        logits = (x @ raw_weight.permute(1, 0, 2).reshape(d, k * c)).view(n, k, c) + raw_bias  # (N, K, C)
        cross_entropy = -(y[:, None, :] * F.log_softmax(logits, dim=2)).sum(2)  # (N, K)
        loss = ((cross_entropy * masks).sum(0) / count[:, 0] + 0.5 * l2 * weight.pow(2).sum((1, 2))).sum()
        loss.backward()
        return loss

    optimizer.step(closure)  # on the evaluate stage's threads: it reserves every CPU (pipeline/evaluation/stage.py)
    shift = torch.as_tensor(centre, dtype=torch.float32)
    return [SoftmaxRegression(weight[j].detach(), bias[j].detach(), mean[j] + shift, scale[j]) for j in range(k)]


@dataclass
class Examples:
    """Features, the distributions the classifier is trained to output, and the truth its predictions are scored
    against (class ids, or relatedness scores)."""
    features: np.ndarray
    targets: np.ndarray
    truth: np.ndarray

    def subset(self, index: np.ndarray) -> "Examples":
        return Examples(self.features[index], self.targets[index], self.truth[index])


Score = Callable[[np.ndarray, np.ndarray], float]  # (predicted probabilities (N, C), truth (N,)) -> higher is better


def classification_accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return accuracy(probabilities.argmax(1), labels)


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float32)[np.asarray(labels)]


def stratified_folds(labels: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """k disjoint index arrays covering every example, each class shuffled and dealt evenly across the folds."""
    labels = np.asarray(labels)
    if len(labels) < k:
        raise ValueError(f"{len(labels)} examples cannot be split into {k} folds; lower "
                         "senteval.classifier.cv_folds or senteval.classifier.inner_folds, or give the task more "
                         "examples")
    folds: list[list[int]] = [[] for _ in range(k)]
    offset = 0
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        for j, index in enumerate(members):
            # continuing the round-robin across classes keeps fold sizes within one of each other
            folds[(offset + j) % k].append(index)
        offset += len(members)
    return [np.sort(np.asarray(fold, dtype=np.int64)) for fold in folds]


def inner_validation(train: Examples, k: int, rng: np.random.Generator) -> list[tuple[np.ndarray, Examples]]:
    """(rows of `train` to fit on, validation examples) of k-fold cross-validation within `train`, stratified by its
    class ids (truth)."""
    folds = stratified_folds(train.truth, k, rng)
    everything = np.arange(len(train.truth))
    return [(np.setdiff1d(everything, fold), train.subset(fold)) for fold in folds]


def select_l2(train: Examples, validation: list[tuple[np.ndarray, Examples]], score: Score,
              settings: ClassifierSettings) -> float:
    """The L2 strength from settings.l2_grid with the best mean validation score (the smallest on ties), each
    validation pair being (rows of `train` to fit on, examples to score)."""
    problems = [(rows, l2) for l2 in settings.l2_grid for rows, _ in validation]
    models = iter(fit_softmax_regressions(train.features, train.targets, problems, settings.max_iter))
    mean_scores = [np.mean([score(next(models).predict_proba(held_out.features), held_out.truth)
                            for _, held_out in validation]) for _ in settings.l2_grid]
    return settings.l2_grid[int(np.argmax(np.nan_to_num(mean_scores, nan=-np.inf)))]


def fit_selecting_l2(train: Examples, validation: list[tuple[np.ndarray, Examples]], score: Score,
                     settings: ClassifierSettings) -> tuple[SoftmaxRegression, float]:
    """select_l2's strength, and the model refitted with it on all of `train`."""
    best = select_l2(train, validation, score, settings)
    everything = np.arange(len(train.truth))
    return fit_softmax_regressions(train.features, train.targets, [(everything, best)], settings.max_iter)[0], best


def cross_validated_accuracy(features: np.ndarray, labels: np.ndarray, num_classes: int,
                             settings: ClassifierSettings, rng: np.random.Generator) -> float:
    """Mean test accuracy over stratified settings.cv_folds folds, the L2 strength chosen inside each training part
    by inner stratified cross-validation (SentEval's InnerKFoldClassifier)."""
    labels = np.asarray(labels)
    examples = Examples(features, one_hot(labels, num_classes), labels)
    everything = np.arange(len(labels))
    test_folds = stratified_folds(labels, settings.cv_folds, rng)
    refits = []
    for test_fold in test_folds:
        train_rows = np.setdiff1d(everything, test_fold)
        train = examples.subset(train_rows)
        best = select_l2(train, inner_validation(train, settings.inner_folds, rng), classification_accuracy,
                         settings)
        refits.append((train_rows, best))
    models = fit_softmax_regressions(examples.features, examples.targets, refits, settings.max_iter)
    return float(np.mean([classification_accuracy(model.predict_proba(features[test_fold]), labels[test_fold])
                          for model, test_fold in zip(models, test_folds)]))


def relatedness_targets(scores: np.ndarray, num_classes: int = 5) -> np.ndarray:
    """Tai et al. 2015, Sec. 4.2: score y in [1, K] as the distribution p with p_floor(y) = floor(y) - y + 1 and
    p_floor(y)+1 = y - floor(y), zero elsewhere, so that sum_i i * p_i = y."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.min() < 1 or scores.max() > num_classes:
        raise ValueError(f"relatedness scores must lie in [1, {num_classes}], got [{scores.min()}, {scores.max()}]")
    lower = np.floor(scores).astype(np.int64)  # class index + 1
    fraction = scores - lower
    targets = np.zeros((len(scores), num_classes), dtype=np.float32)
    rows = np.arange(len(scores))
    targets[rows, lower - 1] = 1 - fraction
    upper = fraction > 0  # y = K has no class above it
    targets[rows[upper], lower[upper]] = fraction[upper]
    return targets


def expected_relatedness(probabilities: np.ndarray) -> np.ndarray:
    """sum_i i * p_i over the classes 1..K: the predicted score."""
    return probabilities @ np.arange(1, probabilities.shape[1] + 1)


def relatedness_pearson(probabilities: np.ndarray, scores: np.ndarray) -> float:
    return pearson(expected_relatedness(probabilities), scores)


def relatedness_regression(train: tuple[np.ndarray, np.ndarray], dev: tuple[np.ndarray, np.ndarray],
                           test: tuple[np.ndarray, np.ndarray], settings: ClassifierSettings) -> dict[str, float]:
    """(features, scores in [1, 5]) per split -> test Pearson and Spearman of the expected score, L2 chosen by dev
    Pearson (SentEval's SICKRelatedness selects on dev Pearson too)."""
    def examples(split):
        return Examples(split[0], relatedness_targets(split[1]), np.asarray(split[1]))

    model, _ = fit_selecting_l2(examples(train), [(np.arange(len(train[1])), examples(dev))],
                                relatedness_pearson, settings)
    predicted = expected_relatedness(model.predict_proba(test[0]))
    return {"pearson": pearson(predicted, test[1]), "spearman": spearman(predicted, test[1])}


# -----------------------------------------------------------------------------
# Tasks: a reader (path, spec) -> data, and an evaluation (encoder, data, settings, batch_size, rng) -> metrics


def _embed_pairs(encoder: Encoder, splits: dict[str, SentencePairs], batch_size: int,
                 names: tuple[str, ...]) -> dict[str, np.ndarray]:
    encoder.prepare([s for split in splits.values() for s in (*split.sentences_a, *split.sentences_b)])
    return {name: pair_features(embed(encoder, split.sentences_a, batch_size),
                                embed(encoder, split.sentences_b, batch_size), names)
            for name, split in splits.items()}


def evaluate_single_sentence(encoder: Encoder, data: LabelledSentences, settings: ClassifierSettings,
                             batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    encoder.prepare(data.sentences)
    features = embed(encoder, data.sentences, batch_size)
    return {"accuracy": cross_validated_accuracy(features, np.asarray(data.labels), len(data.label_names),
                                                 settings, rng)}


def _split_classifier(features: dict[str, np.ndarray], labels: dict[str, list[int]], num_classes: int,
                      selection: str, report: str, settings: ClassifierSettings,
                      rng: np.random.Generator) -> np.ndarray:
    """Predicted classes of split `report`, trained on "train", L2 chosen on split `selection` or, when that is
    "train", by inner cross-validation on it (SentEval's KFoldClassifier)."""
    def examples(name):
        truth = np.asarray(labels[name])
        return Examples(features[name], one_hot(truth, num_classes), truth)

    train = examples("train")
    validation = (inner_validation(train, settings.inner_folds, rng) if selection == "train"
                  else [(np.arange(len(train.truth)), examples(selection))])
    model, _ = fit_selecting_l2(train, validation, classification_accuracy, settings)
    return model.predict_proba(features[report]).argmax(1)


def _pair_classifier(features: dict[str, np.ndarray], splits: dict[str, SentencePairs], selection: str,
                     report: str, settings: ClassifierSettings, rng: np.random.Generator) -> np.ndarray:
    return _split_classifier(features, {name: split.labels for name, split in splits.items()},
                             len(splits["train"].label_names), selection, report, settings, rng)


def evaluate_train_test(encoder: Encoder, splits: dict[str, LabelledSentences], settings: ClassifierSettings,
                        batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    """A single-sentence task with its own train/test split (TREC): SentEval trains on train with the L2 strength
    chosen by inner k-fold cross-validation on train, and reports test accuracy."""
    encoder.prepare([s for split in splits.values() for s in split.sentences])
    features = {name: embed(encoder, split.sentences, batch_size) for name, split in splits.items()}
    predicted = _split_classifier(features, {name: split.labels for name, split in splits.items()},
                                  len(splits["train"].label_names), "train", "test", settings, rng)
    return {"accuracy": accuracy(predicted, splits["test"].labels)}


def evaluate_sick_entailment(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                             batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    predicted = _pair_classifier(features, splits, "dev", "test", settings, rng)
    return {"accuracy": accuracy(predicted, splits["test"].labels)}


def evaluate_sick_relatedness(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                              batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    train, dev, test = ((features[name], np.asarray(splits[name].scores)) for name in ("train", "dev", "test"))
    return relatedness_regression(train, dev, test, settings)


def evaluate_mrpc(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                  batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    predicted = _pair_classifier(features, splits, "train", "dev", settings, rng)
    labels = splits["dev"].labels
    return {"accuracy": accuracy(predicted, labels), "f1": binary_f1(predicted, labels)}


def _read_tsv_task(path: Path, spec: Mapping) -> LabelledSentences:
    names = spec.get("label_names")
    return read_labelled_tsv(path, spec["text_column"], spec["label_column"],
                             [str(n) for n in names] if names is not None else None)


TASK_KINDS: dict[str, tuple[Callable, Callable]] = {
    "mr": (lambda path, spec: read_mr(path), evaluate_single_sentence),
    "cr": (lambda path, spec: read_cr(path), evaluate_single_sentence),
    "subj": (lambda path, spec: read_subj(path), evaluate_single_sentence),
    "mpqa": (lambda path, spec: read_mpqa(path), evaluate_single_sentence),
    "trec": (lambda path, spec: read_trec(path), evaluate_train_test),
    "tsv": (_read_tsv_task, evaluate_single_sentence),
    "sick_entailment": (lambda path, spec: read_sick(path), evaluate_sick_entailment),
    "sick_relatedness": (lambda path, spec: read_sick(path), evaluate_sick_relatedness),
    "mrpc": (lambda path, spec: read_mrpc(path), evaluate_mrpc),
}


PAIR_KINDS = frozenset({"sick_entailment", "sick_relatedness", "mrpc"})  # the kinds scored on pair_features


def task_paths(settings: SentevalConfig) -> dict[str, Path]:
    """Each task's data file or directory (`senteval.tasks.<name>.path` under `senteval.data_root`)."""
    root = Path(settings.data_root).expanduser()
    return {name: root / str(spec["path"]) for name, spec in settings.tasks.items()}


def senteval_files_fingerprint(settings: SentevalConfig, cache_dir: str) -> str:
    """The files of every SentEval task of the `senteval` block."""
    return hashlib.sha256("".join(files_fingerprint(path, "*", cache_dir) if path.is_dir()
                                  else files_fingerprint(path.parent, path.name, cache_dir)
                                  for path in task_paths(settings).values()).encode()).hexdigest()


def evaluation_texts(settings: SentevalConfig) -> dict[str, list[str]]:
    """Per task, the sentences it is scored on: every split but train (SICK's trial and test, MRPC's and TREC's
    test), or all of a task scored by cross-validation (MR, CR, SUBJ, MPQA): what pretraining must not read."""
    texts = {}
    for name, path in task_paths(settings).items():
        spec = settings.tasks[name]
        data = TASK_KINDS[spec["kind"]][0](path, spec)
        splits = [split for split_name, split in data.items() if split_name != "train"] \
            if isinstance(data, dict) else [data]
        texts[name] = [" ".join(tokens) for split in splits
                       for tokens in (split.sentences if isinstance(split, LabelledSentences)
                                      else split.sentences_a + split.sentences_b)]
    return texts


def run_senteval(encoders: list[Encoder], senteval: SentevalConfig, seed: int) -> list[dict]:
    """Evaluate every encoder on every task of the `senteval` block and return rows {encoder, task, metric, score},
    plus the pair_features list on the rows of pair tasks. Each task draws its folds from a generator seeded with
    `seed` alone, so results do not depend on which other tasks or encoders run."""
    settings = ClassifierSettings.from_config(senteval.classifier, senteval.pair_features)
    rows = []
    for task_name, path in task_paths(senteval).items():
        spec = senteval.tasks[task_name]
        if spec["kind"] not in TASK_KINDS:
            raise ValueError(f"senteval task {task_name}: unknown kind {spec['kind']!r}; use one of {list(TASK_KINDS)}")
        read, evaluate = TASK_KINDS[spec["kind"]]
        data = read(path, spec)
        for encoder in encoders:
            start = time.perf_counter()
            metrics = evaluate(encoder, data, settings, senteval.batch_size, np.random.default_rng(seed))
            # printed as the other stages' progress is: a Ray worker's logging stops at WARNING, and an evaluate
            # stage of ten encoders runs for half an hour
            print(f"senteval {encoder.name} on {task_name}: "
                  f"{', '.join(f'{m} {s:.4f}' for m, s in metrics.items())} ({time.perf_counter() - start:.1f} s)",
                  flush=True)
            features = {"pair_features": list(settings.pair_features)} if spec["kind"] in PAIR_KINDS else {}
            rows += [{"encoder": encoder.name, "task": task_name, "metric": metric, "score": round(score, 4),
                      **features} for metric, score in metrics.items()]
    return rows


def results_table(rows: list[dict]) -> list[dict]:
    """One row per encoder with one column per "task metric" (e.g. "MR accuracy"), in the order rows arrive."""
    table: dict[str, dict] = {}
    for row in rows:
        table.setdefault(row["encoder"], {"encoder": row["encoder"]})[f"{row['task']} {row['metric']}"] = row["score"]
    return list(table.values())
