"""Choosing the L2 strength on data the reported score never sees: stratified folds, inner cross-validation
(SentEval's InnerKFoldClassifier) or a validation split, and the outer cross-validation of single-sentence
tasks."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.evaluation.classifier_settings import ClassifierSettings
from pipeline.evaluation.metrics import accuracy
from pipeline.evaluation.softmax_regression import SoftmaxRegression, fit_softmax_regressions


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
