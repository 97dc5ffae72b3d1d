"""SICK relatedness as Tai et al. 2015 score it: the 1..5 score as a distribution over five classes, the
classifier's expected class as its prediction."""
from __future__ import annotations

import numpy as np

from pipeline.evaluation.classifier_settings import ClassifierSettings
from pipeline.evaluation.metrics import pearson, spearman
from pipeline.evaluation.model_selection import Examples, fit_selecting_l2


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
