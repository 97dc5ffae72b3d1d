"""The probes' classifier: multinomial logistic regression (SentEval's LogReg, nhid=0) on standardised features,
many fits by one full-batch L-BFGS run.

Not scikit-learn's LogisticRegression: it takes class labels only, and SICK relatedness trains on soft targets
(Tai et al.'s KL regression, pipeline/evaluation/relatedness.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


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
