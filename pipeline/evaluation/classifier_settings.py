"""How the probes' logistic regression is trained and selected: the `senteval.classifier` block and the settings
object it becomes."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.evaluation.pair_features import DEFAULT_PAIR_FEATURES, check_pair_features


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


@dataclass
class ClassifierConfig:
    """`senteval.classifier`: how the probes' logistic regression is trained and selected; the defaults, and what each
    key means, are those of the settings object it becomes (ClassifierSettings)."""
    l2_grid: list[float] = field(default_factory=lambda: list(ClassifierSettings.l2_grid))
    max_iter: int = ClassifierSettings.max_iter
    cv_folds: int = ClassifierSettings.cv_folds
    inner_folds: int = ClassifierSettings.inner_folds
