"""Classic baselines of the fine-tune table, next to majority class: without one a reader cannot tell whether a
neural row is any good (a bag-of-words logistic regression reaches ~0.77 on MR; Wang & Manning 2012)."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from pipeline.downstream.tasks import TaskSplit
from pipeline.evaluation.metrics import score_task

# Inverse L2 strengths tried; chosen by the mean accuracy of stratified 5-fold cross-validation on train only.
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)


def bow_logreg_scores(task: DictConfig, train: TaskSplit, dev: TaskSplit, seed: int) -> dict[str, float]:
    """TF-IDF of word unigrams and bigrams and a logistic regression, scored on dev by the task's metric. A pair
    task's two texts are vectorised with one vocabulary (fitted on both sides of train) and their vectors
    concatenated, so a word can weigh differently in the first and the second text."""
    # scikit-learn (and its scipy) load only when a baseline is fitted: the other stages never need them
    import scipy.sparse
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold

    vectorizer = TfidfVectorizer(ngram_range=(1, 2))
    vectorizer.fit(train.texts_a + (train.texts_b or []))

    def features(split: TaskSplit):
        sides = [split.texts_a] + ([split.texts_b] if split.texts_b is not None else [])
        return scipy.sparse.hstack([vectorizer.transform(texts) for texts in sides]).tocsr()

    labels = np.asarray(train.labels)
    # stratified folds need each class in every fold: fewer folds for a tiny train split (two at least)
    folds = max(2, min(5, int(np.bincount(labels).min())))
    model = LogisticRegressionCV(Cs=list(C_GRID), cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
                                 scoring="accuracy", max_iter=1000, n_jobs=1,
                                 l1_ratios=(0.0,), use_legacy_attributes=False)  # plain L2, as 1.10 will default
    model.fit(features(train), labels)
    return score_task(task.metric, model.predict(features(dev)).tolist(), dev.labels)
