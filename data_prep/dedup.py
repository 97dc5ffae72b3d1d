"""Book-level near-duplicate detection with MinHash and LSH banding.

Two editions of one book (different front matter, spelling fixes, a missing chapter) are not exact
duplicates but share most of their word 5-grams. The Jaccard similarity of two books' sets of 5-gram
"shingles" is estimated by the share of equal entries in their MinHash signatures (Broder, "On the
resemblance and containment of documents", 1997), and locality-sensitive hashing by bands finds the
candidate pairs without comparing every pair (Leskovec, Rajaraman & Ullman, "Mining of Massive
Datasets", ch. 3.4). Signatures are computed where the book is processed (a Ray task); the driver only
holds `num_perm` 64-bit values per kept book plus the band tables, never the texts.

Translations share no shingles with the original and are not caught; that needs cross-lingual
embeddings, not shingles.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Punctuation becomes a word break and case is folded: editions differ in quotes, dashes and
# capitalisation far more often than in words. (RE2 syntax: Arrow's regex engine.)
_NOT_WORD = r"[^\p{L}\p{N}\s]+"
# Multiplier of the polynomial that combines word hashes into a shingle hash (mod 2^64): any large odd
# constant works; this one is the 64-bit golden ratio used by splitmix64.
_SHINGLE_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_EMPTY_BIN = np.iinfo(np.uint64).max


@dataclasses.dataclass(frozen=True)
class NearDuplicateOptions:
    """threshold: estimated Jaccard similarity of shingle sets at or above which a book is a near
        duplicate of an earlier one. shingle_words: words per shingle (5, as in Broder's experiments on
        web pages; shorter shingles make unrelated prose look similar). num_perm: MinHash signature
        length, a power of two; the standard error of the estimate is about sqrt(J (1 - J) / num_perm),
        0.035 at J = 0.8 with 128. seed: draws the hash function; same seed, same decisions."""

    threshold: float = 0.8
    shingle_words: int = 5
    num_perm: int = 128
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1], got {self.threshold}; 0.8 is typical")
        if self.shingle_words < 1:
            raise ValueError(f"shingle_words must be positive, got {self.shingle_words}")
        if self.num_perm < 2 or self.num_perm & (self.num_perm - 1):
            raise ValueError(f"num_perm must be a power of two >= 2 (bins are the top hash bits), got {self.num_perm}")


@dataclasses.dataclass(frozen=True)
class MinHasher:
    """One-permutation MinHash (Li, Owen & Zhang, "One Permutation Hashing", NIPS 2012): one hash
    h(x) = a * x + b (mod 2^64), a odd, a bijection of 64-bit values (multiply-add hashing, Dietzfelbinger
    et al. 1997); its top log2(num_perm) bits pick a bin and the signature is each bin's minimum. Costs one
    hash per shingle instead of num_perm of them: 128x less work than classic MinHash for the same
    estimator, which matters because it runs on every byte of the corpus."""

    num_perm: int
    multiplier: np.uint64
    increment: np.uint64


def draw_minhasher(num_perm: int, rng: np.random.Generator) -> MinHasher:
    multiplier, increment = rng.integers(0, 2**64, size=2, dtype=np.uint64)
    return MinHasher(num_perm, multiplier | np.uint64(1), increment)


def _word_hash(word: str) -> int:
    # blake2b rather than hash(): str hashes are salted per process (PYTHONHASHSEED), signatures computed
    # in different Ray workers must agree.
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


def shingle_hashes(texts: Iterable[str], shingle_words: int) -> np.ndarray:
    """64-bit hashes of the book's word `shingle_words`-grams, repeats included (a minimum ignores them),
    running across sentence and paragraph boundaries. A book shorter than one shingle is a single shingle
    of all its words. Splitting and word lookup run in Arrow's C++ kernels, not per word in Python."""
    text = pc.utf8_lower(pa.array([" ".join(texts)], pa.large_string()))
    words = pc.utf8_split_whitespace(pc.replace_substring_regex(text, _NOT_WORD, " ")).flatten()
    # the split keeps an empty "word" for leading or trailing whitespace
    words = words.filter(pc.greater(pc.utf8_length(words), 0))
    if len(words) == 0:
        return np.zeros(0, dtype=np.uint64)
    encoded = pc.dictionary_encode(words)
    vocabulary = encoded.dictionary.to_pylist()
    vocabulary_hashes = np.fromiter(map(_word_hash, vocabulary), dtype=np.uint64, count=len(vocabulary))
    hashes = vocabulary_hashes[encoded.indices.to_numpy()]
    width = min(shingle_words, len(hashes))
    shingles = np.zeros(len(hashes) - width + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic mod 2^64 is the point
        for offset in range(width):
            shingles = shingles * _SHINGLE_MULTIPLIER + hashes[offset: len(shingles) + offset]
    return shingles


def minhash_signature(shingles: np.ndarray, hasher: MinHasher) -> np.ndarray:
    """Each bin's minimum hash (uint64, `num_perm` of them). A bin no shingle fell into (only in books of
    a few hundred words) borrows the next non-empty bin's value, circularly, mixed with the distance, the
    "rotation" densification of Shrivastava & Li (ICML 2014) that keeps the estimator unbiased. A book
    without words gets all-ones, which `NearDuplicateIndex` never matches."""
    bin_bits = hasher.num_perm.bit_length() - 1
    signature = np.full(hasher.num_perm, _EMPTY_BIN, dtype=np.uint64)
    if len(shingles) == 0:
        return signature
    with np.errstate(over="ignore"):
        hashed = shingles * hasher.multiplier + hasher.increment
    bins = (hashed >> np.uint64(64 - bin_bits)).astype(np.intp)
    # Values below the bin bits stay below _EMPTY_BIN, so a filled bin is never mistaken for an empty one.
    np.minimum.at(signature, bins, hashed & np.uint64((1 << (64 - bin_bits)) - 1))
    empty = signature == _EMPTY_BIN
    if empty.any():
        filled = np.flatnonzero(~empty)
        positions = np.arange(hasher.num_perm)
        # the first filled bin at or after each position, wrapping around
        source = filled[np.searchsorted(filled, positions) % len(filled)]
        distance = ((source - positions) % hasher.num_perm).astype(np.uint64)
        with np.errstate(over="ignore"):
            signature = np.where(empty, signature[source] + distance * _SHINGLE_MULTIPLIER, signature)
    return signature


# Candidates are verified on the whole signature, so a false positive of the banding costs one comparison
# while a false negative is a missed duplicate: misses weigh 9x more when choosing the bands.
_FALSE_NEGATIVE_WEIGHT = 0.9


def lsh_bands(num_perm: int, threshold: float) -> tuple[int, int]:
    """(bands, rows per band), bands x rows <= num_perm, minimising the weighted false-positive and
    false-negative areas of the candidate probability 1 - (1 - J^rows)^bands around `threshold` (the
    criterion of datasketch's MinHashLSH._optimal_param, with its weights set to 0.1/0.9)."""
    similarity = np.linspace(0.0, 1.0, 1001)
    below = similarity < threshold
    best, best_error = (1, num_perm), np.inf
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        candidate = 1.0 - (1.0 - similarity**rows) ** bands
        error = ((1 - _FALSE_NEGATIVE_WEIGHT) * candidate[below].sum()
                 + _FALSE_NEGATIVE_WEIGHT * (1.0 - candidate[~below]).sum())
        if error < best_error:
            best, best_error = (bands, rows), error
    return best


class NearDuplicateIndex:
    """Kept books' signatures in input order; `match` finds the most similar earlier one.

    Deterministic: candidates are compared in input order and ties go to the earliest, so the result
    depends only on the books and their order, not on which Ray task finished first.
    """

    def __init__(self, options: NearDuplicateOptions):
        self.options = options
        self.bands, self.rows = lsh_bands(options.num_perm, options.threshold)
        self._book_ids: list[str] = []
        self._signatures: list[np.ndarray] = []
        self._buckets: list[dict[bytes, list[int]]] = [{} for _ in range(self.bands)]

    def _band_keys(self, signature: np.ndarray) -> list[bytes]:
        return [signature[band * self.rows: (band + 1) * self.rows].tobytes() for band in range(self.bands)]

    def match(self, signature: np.ndarray) -> tuple[str, float] | None:
        """(book_id, estimated Jaccard similarity) of the most similar indexed book at or above the
        threshold, else None. Does not add `signature`: call `add` for books that are kept."""
        if (signature == _EMPTY_BIN).all():
            return None  # no words at all: nothing to compare
        candidates = sorted({index for band, key in enumerate(self._band_keys(signature))
                             for index in self._buckets[band].get(key, ())})
        best = None
        for index in candidates:
            similarity = float(np.mean(self._signatures[index] == signature))
            if similarity >= self.options.threshold and (best is None or similarity > best[1]):
                best = (self._book_ids[index], similarity)
        return best

    def add(self, book_id: str, signature: np.ndarray) -> None:
        index = len(self._signatures)
        self._book_ids.append(book_id)
        self._signatures.append(signature)
        for band, key in enumerate(self._band_keys(signature)):
            self._buckets[band].setdefault(key, []).append(index)
