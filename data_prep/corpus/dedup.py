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
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Words are runs of letters and digits; case is folded and punctuation breaks words, since editions differ in
# quotes, dashes and capitalisation far more often than in words. Found on the UTF-8 bytes in numpy (Arrow's
# regex with Unicode classes ran at ~20 MB/s, a third of the prepare stage): every ASCII byte but [a-z0-9] breaks
# a word, and so do the Latin-1 punctuation block U+0080-U+00BF (no-break space, guillemets, inverted marks) and
# General Punctuation U+2000-U+206F (typographic spaces, dashes, curly quotes, ellipsis), which hold nearly all
# the non-ASCII punctuation of books in European languages; other non-ASCII characters (accented letters) belong to
# words. Chinese, written without spaces, is read as characters: each CJK ideograph is a word, so that a shingle of 5
# is a character 5-gram, and CJK punctuation breaks words (_cjk_bytes).
_ASCII_WORD_BYTE = np.zeros(256, dtype=bool)
_ASCII_WORD_BYTE[np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)] = True
_ASCII_WORD_BYTE[0x80:] = True
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
            raise ValueError(f"data.near_duplicate_threshold must be in (0, 1], got {self.threshold}; 0.8 is "
                             "typical, null keeps near duplicates")
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


# Bytes of a word that enter its hash: longer "words" (run-on garbage, not prose) hash by these and their length.
_HASHED_WORD_BYTES = 64
_BYTE_WEIGHTS = np.cumprod(np.full(_HASHED_WORD_BYTES, _SHINGLE_MULTIPLIER), dtype=np.uint64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: every input bit flips each output bit with probability ~1/2."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


def _word_byte_mask(data: np.ndarray) -> np.ndarray:
    """True for the bytes of lowercased UTF-8 text that belong to words (see _ASCII_WORD_BYTE)."""
    is_word = _ASCII_WORD_BYTE[data]
    latin1_punctuation = np.flatnonzero(data[:-1] == 0xC2)  # U+0080-U+00BF are C2 80..C2 BF
    is_word[latin1_punctuation] = is_word[latin1_punctuation + 1] = False
    general_punctuation = np.flatnonzero((data[:-2] == 0xE2) & ((data[1:-1] == 0x80) | (data[1:-1] == 0x81)))
    for following in range(3):  # U+2000-U+207F are E2 80 80..E2 81 BF
        is_word[general_punctuation + following] = False
    return is_word


# Code points of 3-byte UTF-8 characters that break words like ASCII punctuation: CJK Symbols and Punctuation (。、「」
# 《》 and the ideographic space), and the punctuation of the full-width forms (！（），：；？［］｛｝｡｢｣､)
_CJK_PUNCTUATION = ((0x3000, 0x303F), (0xFF00, 0xFF0F), (0xFF1A, 0xFF20), (0xFF3B, 0xFF40), (0xFF5B, 0xFF65))
# and the ideographs (BMP blocks of data_prep/corpus/chinese.py's CJK_IDEOGRAPHS), each a word of its own
_CJK_IDEOGRAPH_BLOCKS = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))


def _cjk_bytes(data: np.ndarray, is_word: np.ndarray) -> np.ndarray:
    """Marks the bytes of CJK punctuation as non-word in `is_word` (in place) and returns the positions of the first
    bytes of CJK ideographs: Chinese has no spaces, so without this a paragraph was one "word" and a Chinese book a
    single shingle. Ideographs outside the Basic Multilingual Plane (4-byte, rare) stay parts of runs."""
    leads = np.flatnonzero((data[:-2] & 0xF0) == 0xE0)  # valid UTF-8 (Arrow's): 0xE0-0xEF only lead 3-byte sequences
    if not len(leads):
        return leads
    code = ((data[leads].astype(np.int64) & 0x0F) << 12) | ((data[leads + 1].astype(np.int64) & 0x3F) << 6) \
        | (data[leads + 2].astype(np.int64) & 0x3F)
    punctuation = leads[np.any([(code >= low) & (code <= high) for low, high in _CJK_PUNCTUATION], axis=0)]
    for following in range(3):
        is_word[punctuation + following] = False
    return leads[np.any([(code >= low) & (code <= high) for low, high in _CJK_IDEOGRAPH_BLOCKS], axis=0)]


def _hash_byte_runs(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each run data[starts[i]:starts[i + 1]] (the last run ends with `data`), the same in every
    process (str's hash() is salted per process, and signatures computed in different Ray workers must agree): a
    polynomial in the bytes mod 2^64, mixed; all in numpy, not word by word in Python."""
    lengths = np.diff(starts, append=len(data))
    position = np.arange(len(data)) - np.repeat(starts, lengths)
    hashed = position < _HASHED_WORD_BYTES
    hashed_lengths = np.minimum(lengths, _HASHED_WORD_BYTES)
    with np.errstate(over="ignore"):  # arithmetic mod 2^64 is the point
        terms = (data[hashed].astype(np.uint64) + np.uint64(1)) * _BYTE_WEIGHTS[position[hashed]]
        per_run = np.add.reduceat(terms, np.cumsum(hashed_lengths) - hashed_lengths)
        return _mix64(per_run + lengths.astype(np.uint64) * _SHINGLE_MULTIPLIER)


def _hash_words(word_bytes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """_hash_byte_runs of each word word_bytes[starts[i]:starts[i + 1]], computed once per distinct word: a book's
    words are ~10x fewer distinct ones, which Arrow's hash table finds faster than numpy hashes every byte."""
    bounds = np.append(starts, len(word_bytes)).astype(np.int64)
    words = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts),
                                             [None, pa.py_buffer(bounds), pa.py_buffer(word_bytes)])
    encoded = pc.dictionary_encode(words)
    distinct = encoded.dictionary
    offsets = np.frombuffer(distinct.buffers()[1], np.int64)[distinct.offset: distinct.offset + len(distinct) + 1]
    data = np.frombuffer(distinct.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    return _hash_byte_runs(data, offsets[:-1] - offsets[0])[encoded.indices.to_numpy()]


def shingle_hashes(texts: pa.Array | Sequence[str], shingle_words: int) -> np.ndarray:
    """64-bit hashes of the book's word `shingle_words`-grams, repeats included (a minimum ignores them),
    running across sentence and paragraph boundaries. A book shorter than one shingle is a single shingle
    of all its words."""
    if not isinstance(texts, pa.Array):
        texts = pa.array(texts, pa.string())
    lowered = pc.utf8_lower(texts)
    offset_type = np.int64 if pa.types.is_large_string(lowered.type) else np.int32
    offsets = np.frombuffer(lowered.buffers()[1], offset_type)[lowered.offset: lowered.offset + len(lowered) + 1]
    data = np.frombuffer(lowered.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]  # Arrow pads its buffers
    is_word = _word_byte_mask(data)
    ideographs = _cjk_bytes(data, is_word)
    starts_word = is_word & ~np.concatenate([[False], is_word[:-1]])
    if len(ideographs):  # each CJK ideograph a word of its own, and what follows one starts another: character n-grams
        starts_word[ideographs] = True
        after = ideographs + 3
        after = after[after < len(data)]
        starts_word[after] |= is_word[after]
    text_starts = offsets[:-1] - offsets[0]
    text_starts = text_starts[text_starts < len(data)]  # empty texts at the end start nowhere
    starts_word[text_starts] |= is_word[text_starts]  # texts are not separated by a space: each starts a word
    run_starts = np.flatnonzero(starts_word[is_word])  # where each word starts among the word bytes alone
    if len(run_starts) == 0:
        return np.zeros(0, dtype=np.uint64)
    hashes = _hash_words(data[is_word], run_starts)
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
