"""Decontamination: the pretraining text loses every sentence that overlaps the evaluation text of the run.

A model pretrained on the sentences it is later scored on has seen the test: its score no longer says how well it
generalises (Brown et al. 2020, appendix C, who removed from GPT-3's training data every document sharing a 13-gram
with a benchmark's test set). Here the unit removed is the corpus sentence, not the document, and two rules mark it:
- its normalised words equal those of an evaluation sentence (whatever its length: a review sentence of four words
  that is also a dev sentence is the dev sentence);
- a span of `n` words of the book's word stream that overlaps it (possibly running on into the next sentence) is also
  a span of an evaluation text (Brown et al.'s 13-gram rule; `n` configurable).
Normalisation (NFKC, case-folded, contractions rejoined and apostrophes dropped, words = runs of word characters and
each CJK character alone, as BERT-Chinese tokenizes, so that n words of Chinese are n characters; punctuation dropped)
makes "The Rock isn't..." match the lower-cased, tokenised "the rock is n't ..." of SentEval's readers and Rotten
Tomatoes' files. Words are hashed to 64 bits (blake2b, stable across processes) and n-grams to 64-bit polynomial hashes
over them, so a book is checked with a few numpy passes; a collision between a corpus n-gram and one of ~10^6 evaluation
n-grams has probability ~10^-13 per n-gram.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from data_prep.corpus.chinese import CJK_IDEOGRAPHS, split_chinese_sentences

DEFAULT_NGRAM = 13  # Brown et al. 2020, appendix C
# words: each CJK ideograph alone (Chinese has no spaces: as one `\w+` run, a Chinese sentence was one word and the
# n-gram rule never fired), or a run of other word characters
_WORD = re.compile(f"[{CJK_IDEOGRAPHS}]|[^\\W{CJK_IDEOGRAPHS}]+")
# a tokeniser's split contraction ("is n't", "century 's") is joined back, then apostrophes go: "isnt", "centurys"
_SPLIT_CONTRACTION = re.compile(r"\s+(?=n't\b|'(?:s|re|ve|ll|d|m|t)\b)")
_APOSTROPHES = str.maketrans({"'": None, "\u2019": None, "`": None})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd multiplier: the polynomial hash of n word hashes, modulo 2^64


def normalised_words(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")
    return _WORD.findall(_SPLIT_CONTRACTION.sub("", text).translate(_APOSTROPHES))


def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


class _WordHashes(dict):
    """word -> its 64-bit hash, computed once per distinct word."""

    def __missing__(self, word: str) -> int:
        value = self[word] = _word_hash(word)
        return value

    def of(self, words: Sequence[str]) -> np.ndarray:
        return np.fromiter((self[w] for w in words), dtype=np.uint64, count=len(words))


def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every run of `n` consecutive words: (len - n + 1,) uint64, empty when there are fewer words."""
    count = len(word_hashes) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64 is the point
        hashes = word_hashes[:count].copy()
        for i in range(1, n):
            hashes = hashes * _BASE + word_hashes[i:i + count]
    return hashes


def _sentence_hash(words: Sequence[str]) -> int:
    """One hash for a whole normalised sentence (looked up in a table of its own, apart from the n-grams)."""
    return _word_hash(" ".join(words))


@dataclass(frozen=True)
class EvaluationOverlap:
    """The evaluation texts of a run, indexed: sorted hashes of their sentences and of their n-grams, each with a
    bitmask of the sources (e.g. "rotten_tomatoes dev") it came from."""
    sources: tuple[str, ...]
    n: int
    sentence_hashes: np.ndarray  # (S,) uint64, sorted
    sentence_sources: np.ndarray  # (S,) uint64 bitmask over `sources`
    ngram_hashes: np.ndarray     # (G,) uint64, sorted
    ngram_sources: np.ndarray    # (G,) uint64 bitmask

    @classmethod
    def build(cls, texts_by_source: Mapping[str, Iterable[str]], n: int = DEFAULT_NGRAM) -> EvaluationOverlap:
        if n < 1:
            raise ValueError(f"data.decontamination_ngram={n}: an n-gram has at least 1 word")
        if len(texts_by_source) > 64:
            raise ValueError(f"{len(texts_by_source)} evaluation sources; at most 64 are told apart")
        words = _WordHashes()
        sentences: dict[int, int] = {}
        ngrams: dict[int, int] = {}
        for bit, texts in enumerate(texts_by_source.values()):
            mask = 1 << bit
            for text in texts:
                for sentence in {text, *_SENTENCE_END.split(text), *split_chinese_sentences(text)}:
                    if normal := normalised_words(sentence):
                        key = _sentence_hash(normal)
                        sentences[key] = sentences.get(key, 0) | mask
                for key in ngram_hashes(words.of(normalised_words(text)), n).tolist():
                    ngrams[key] = ngrams.get(key, 0) | mask
        return cls(tuple(texts_by_source), n, *_sorted_table(sentences), *_sorted_table(ngrams))

    def overlapping(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """For one book's sentences in reading order: (S,) bool, the sentences that overlap the evaluation text, and
        (S,) uint64, the bitmask of the sources each overlaps."""
        words = _WordHashes()
        normal = [normalised_words(s) for s in sentences]
        whole = np.fromiter((_sentence_hash(w) for w in normal), dtype=np.uint64, count=len(normal))
        sources = _lookup(whole, self.sentence_hashes, self.sentence_sources)
        sources[[not w for w in normal]] = 0  # a sentence without words matches nothing
        per_sentence = [words.of(w) for w in normal]
        stream = np.concatenate(per_sentence) if per_sentence else np.empty(0, dtype=np.uint64)
        sentence_of_word = np.repeat(np.arange(len(sentences)), [len(h) for h in per_sentence])
        found = _lookup(ngram_hashes(stream, self.n), self.ngram_hashes, self.ngram_sources)
        for start in np.flatnonzero(found):  # every sentence the matching span touches
            touched = np.unique(sentence_of_word[start:start + self.n])
            sources[touched] |= found[start]
        return sources != 0, sources

    def source_counts(self, sources: np.ndarray) -> dict[str, int]:
        """How many of the sentences (bitmasks from `overlapping`) overlap each source."""
        return {name: int(np.count_nonzero(sources & np.uint64(1 << bit)))
                for bit, name in enumerate(self.sources) if np.any(sources & np.uint64(1 << bit))}

    def __len__(self) -> int:
        return len(self.sentence_hashes) + len(self.ngram_hashes)


def _sorted_table(table: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.fromiter(table, dtype=np.uint64, count=len(table))
    values = np.fromiter(table.values(), dtype=np.uint64, count=len(table))
    order = np.argsort(keys)
    return keys[order], values[order]


def _lookup(queries: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[k] where queries[i] == keys[k], else 0."""
    if not len(keys) or not len(queries):
        return np.zeros(len(queries), dtype=np.uint64)
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[at] == queries, values[at], np.uint64(0))
