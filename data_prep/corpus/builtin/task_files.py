"""How the built-in tasks' files are cut and written: a held-out split fixed by a seed, and the TSV and CoNLL layouts
the task readers take."""
from __future__ import annotations

from pathlib import Path


def heldout_split(count: int, fractions: tuple[float, ...], seed: int) -> list[list[int]]:
    """Indices 0..count-1 shuffled by `seed` and cut into parts of the given fractions (the last takes the rest),
    each part sorted: a split that depends only on the count and the seed."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(count)
    cuts = np.cumsum([round(f * count) for f in fractions[:-1]])
    return [sorted(part.tolist()) for part in np.split(order, cuts)]


def write_tsv(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("sentence", "label")) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\t".join(header) + "\n")
        for sentence, label in rows:
            f.write(f"{sentence.replace(chr(9), ' ')}\t{label}\n")


def write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for sentence in sentences:
            f.write("".join(f"{token} {tag}\n" for token, tag in sentence) + "\n")
