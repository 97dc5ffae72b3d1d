import random

import numpy as np
import pytest

from data_prep.corpus.dedup import (
    NearDuplicateIndex,
    NearDuplicateOptions,
    _hash_byte_runs,
    _hash_words,
    draw_minhasher,
    lsh_bands,
    minhash_signature,
    shingle_hashes,
)
from data_prep.corpus.prepare import prepare_corpus

WORDS = ("ship sea harbour captain storm wind sail anchor rope deck wave night morning island shore gull "
         "lantern tide rock compass map gold crew mast cabin letter brother king river forest song city").split()


def book_words(seed: int, n_words: int = 6000) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n_words)]


def edited(words: list[str], fraction: float, seed: int) -> list[str]:
    """A copy with `fraction` of the words replaced, as an edition with corrections and changed words."""
    rng = random.Random(seed)
    copy = list(words)
    for index in rng.sample(range(len(copy)), int(fraction * len(copy))):
        copy[index] = "edited"
    return copy


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    a, b = set(a.tolist()), set(b.tolist())
    return len(a & b) / len(a | b)


def signature(words: list[str], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    shingles = shingle_hashes([" ".join(words)], 5)
    return shingles, minhash_signature(shingles, draw_minhasher(128, np.random.default_rng(seed)))


def test_shingles_ignore_case_punctuation_and_sentence_boundaries():
    assert np.array_equal(shingle_hashes(["The cat, sat.", "On THE mat!"], 5),
                          shingle_hashes(["the cat sat on the mat"], 5))
    assert len(shingle_hashes(["one two three"], 5)) == 1  # shorter than a shingle: one shingle
    assert len(shingle_hashes(["...", ""], 5)) == 0


def test_words_are_runs_of_letters_and_digits_in_any_script():
    def words(*texts):
        return shingle_hashes(list(texts), 1)

    # typographic punctuation and spaces break words as ASCII punctuation does
    assert np.array_equal(words("a\u2014b \u201cc\u201d d\u00a0e \u00abf\u00bb g\u2026"), words("a b c d e f g"))
    # accented and non-Latin letters belong to words; case is folded beyond ASCII
    assert np.array_equal(words("\u00c9t\u00e9 \u0394\u03ac"), words("\u00e9t\u00e9 \u03b4\u03ac"))
    assert not np.array_equal(words("\u00e9t\u00e9"), words("t t"))
    # texts are words apart even with no space between them; empty texts add nothing
    assert np.array_equal(words("ab", "", "cd", ""), words("ab cd"))
    assert not np.array_equal(words("ab", "cd"), words("abcd"))
    # a word longer than the hashed prefix still differs from others by its length
    assert len(set(words("x" * 70, "x" * 71, "x" * 64).tolist())) == 3


def test_hashing_each_distinct_word_once_gives_every_words_own_hash():
    words = [w.encode() for w in book_words(3, 500)] + ["\u00e9t\u00e9".encode(), b"x" * 70, b"ship"]
    word_bytes = np.frombuffer(b"".join(words), np.uint8)
    starts = np.cumsum([0] + [len(w) for w in words[:-1]])
    expected = _hash_byte_runs(word_bytes, starts)
    assert len(set(expected.tolist())) == len(set(words))  # the reference itself tells the words apart
    assert np.array_equal(_hash_words(word_bytes, starts), expected)


@pytest.mark.parametrize("fraction", [0.005, 0.02, 0.05])
def test_signature_estimates_jaccard_of_edited_copies(fraction):
    original, copy = book_words(1), edited(book_words(1), fraction, seed=2)
    (shingles_a, signature_a), (shingles_b, signature_b) = signature(original), signature(copy)
    estimate = np.mean(signature_a == signature_b)
    # 3 standard errors of a 128-bin estimate at this similarity
    true = jaccard(shingles_a, shingles_b)
    assert abs(estimate - true) <= 3 * np.sqrt(true * (1 - true) / 128) + 1e-9


def test_small_book_signatures_are_filled_and_deterministic():
    shingles, first = signature("a short book of only a few words here".split())
    assert len(shingles) < 128 and (first != np.iinfo(np.uint64).max).all()  # empty bins densified
    assert np.array_equal(first, signature("a short book of only a few words here".split())[1])
    assert not np.array_equal(first, signature("a short book of only a few words here".split(), seed=1)[1])


def test_bands_favour_recall_at_the_threshold():
    bands, rows = lsh_bands(128, 0.8)
    assert bands * rows <= 128
    assert 1 - (1 - 0.85**rows) ** bands > 0.95  # a pair just above the threshold is almost surely a candidate
    assert 1 - (1 - 0.3**rows) ** bands < 0.01  # unrelated books are almost never compared


def test_index_finds_edited_copies_and_not_unrelated_books():
    index = NearDuplicateIndex(NearDuplicateOptions(threshold=0.8))
    originals = {f"book{seed}": book_words(seed) for seed in range(10)}  # the control: unrelated books
    for book_id, words in originals.items():
        assert index.match(signature(words)[1]) is None
        index.add(book_id, signature(words)[1])
    close = index.match(signature(edited(originals["book3"], 0.01, seed=7))[1])
    assert close[0] == "book3" and 0.8 <= close[1] < 1.0
    assert index.match(signature(edited(originals["book3"], 0.25, seed=7))[1]) is None  # too different


def test_invalid_options_say_what_to_fix():
    with pytest.raises(ValueError, match="0.8 is typical"):
        NearDuplicateOptions(threshold=1.5)
    with pytest.raises(ValueError, match="power of two"):
        NearDuplicateOptions(num_perm=100)


def write_book(path, words: list[str]) -> None:
    sentences = [" ".join(words[i: i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
    path.write_text("\n\n".join(" ".join(sentences[i: i + 5]) for i in range(0, len(sentences), 5)) + "\n")


@pytest.mark.usefixtures("ray_session")
def test_prepare_drops_near_duplicates_and_records_the_similarity(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for seed in range(4):
        write_book(corpus / f"a{seed}.txt", book_words(seed))
    write_book(corpus / "b_second_edition.txt", edited(book_words(1), 0.01, seed=5))
    write_book(corpus / "c_revised.txt", edited(book_words(2), 0.3, seed=6))  # heavily revised: kept
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=2, shard_bytes=1 << 20)
    files = {entry["book_id"]: entry for entry in manifest["files"]}
    assert [book_id for book_id, entry in files.items() if entry["status"] != "kept"] == ["b_second_edition.txt"]
    edition = files["b_second_edition.txt"]
    assert (edition["status"], edition["duplicate_of"], edition["sentences"]) == ("near_duplicate", "a1.txt", 0)
    assert 0.8 <= edition["similarity"] < 1.0
    assert manifest["totals"]["files_near_duplicate"] == 1

    kept_all = prepare_corpus(corpus, tmp_path / "out2", num_workers=1, shard_bytes=1 << 20, near_duplicates=None)
    assert kept_all["totals"]["files_kept"] == 6 and kept_all["options"]["near_duplicates"] is None
