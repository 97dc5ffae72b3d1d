"""What the probes' classifier sees of a sentence pair's two embeddings u and v (`senteval.pair_features`)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

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
