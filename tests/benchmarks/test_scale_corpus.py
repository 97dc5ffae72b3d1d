"""benchmarks/make_scale_corpus.py: synthetic book trees for the data stages at scale (issue 19)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from data_prep.corpus.dedup import shingle_hashes
from data_prep.corpus.ingest import header_field, reflow_paragraphs, strip_gutenberg_boilerplate
from tests.helpers import write_books

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from make_scale_corpus import RECORD, build_tree, parse_size, write_corpus  # noqa: E402

NEAR_DUPLICATE_THRESHOLD = 0.8  # data.near_duplicate_threshold's default (pipeline/schema.py)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Books with Gutenberg's licence header and footer around write_books' bodies."""
    root = write_books(tmp_path_factory.mktemp("plain"), n_books=8, paragraphs=30)
    out = tmp_path_factory.mktemp("sources")
    for i, path in enumerate(sorted(root.glob("*.txt"))):
        (out / path.name).write_text(
            f"The Project Gutenberg EBook of Book {i}\n\nTitle: Book {i}\n\nAuthor: A. Writer\n\n"
            f"*** START OF THIS PROJECT GUTENBERG EBOOK BOOK {i} ***\n\n{path.read_text()}\n\n"
            f"*** END OF THIS PROJECT GUTENBERG EBOOK BOOK {i} ***\n\nlicence text\n")
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.txt"))}


def test_the_same_seed_writes_the_same_tree_and_another_seed_another(sources, tmp_path):
    summaries = [write_corpus(sources, tmp_path / name, 40_000, seed=seed, book_bytes=2_000, books_per_dir=5)
                 for name, seed in (("a", 7), ("b", 7), ("c", 8))]
    assert summaries[0] == summaries[1] and summaries[0]["bytes"] >= 40_000
    a, b, c = (_tree(tmp_path / name) for name in "abc")
    assert a == b and a != c
    assert len(a) == summaries[0]["books"] and len({p.split("/")[0] for p in a}) == -(-len(a) // 5)


def test_synthetic_books_are_gutenberg_books_with_titles_of_their_own_and_not_near_duplicates(sources, tmp_path):
    write_corpus(sources, tmp_path, 60_000, book_bytes=3_000)
    books = [p.read_text() for p in sorted(tmp_path.rglob("*.txt"))]
    assert len(books) >= 15
    titles, shingles = set(), []
    for text in books:
        header, body = strip_gutenberg_boilerplate(text)
        assert "END OF THIS PROJECT" not in body and body.strip()
        titles.add(header_field(header, "Title"))
        shingles.append(set(shingle_hashes(reflow_paragraphs(body), 5).tolist()))
    assert len(titles) == len(books)
    worst = max(len(x & y) / len(x | y) for i, x in enumerate(shingles) for y in shingles[i + 1:])
    assert worst < NEAR_DUPLICATE_THRESHOLD / 2  # the dedup stage keeps them all, with room to spare


def test_sizes_read_as_a_user_writes_them():
    assert parse_size("1GB") == 1 << 30 and parse_size("2.5gb") == int(2.5 * (1 << 30))
    assert parse_size("500MB") == 500 << 20 and parse_size("1234") == 1234


def test_a_source_directory_without_books_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="point --source at a directory of Gutenberg"):
        write_corpus(tmp_path, tmp_path / "out", 1000)


def test_a_tree_is_reused_only_when_built_complete_with_the_same_size_and_seed(sources, tmp_path):
    out = tmp_path / "tree"
    first = build_tree(sources, out, 20_000, seed=1, book_bytes=2_000)
    assert not first["reused"] and first["written"]["bytes"] >= 20_000
    books = _tree(out)
    assert build_tree(sources, out, 20_000, seed=1, book_bytes=2_000)["reused"]

    other = build_tree(sources, out, 10_000, seed=2, book_bytes=2_000)
    assert not other["reused"]
    assert len(_tree(out)) == other["written"]["books"] < len(books)  # the larger tree's books are gone
    assert _tree(out) != books

    record = out / RECORD
    record.write_text(json.dumps({**json.loads(record.read_text()), "complete": False}))  # a build cut short
    assert not build_tree(sources, out, 10_000, seed=2, book_bytes=2_000)["reused"]


def test_a_directory_it_did_not_build_is_never_removed(sources, tmp_path):
    (tmp_path / "mine.txt").write_text("someone's book")
    with pytest.raises(SystemExit, match="not a tree make_scale_corpus.py built; pass an empty or new directory"):
        build_tree(sources, tmp_path, 10_000, book_bytes=2_000)
    assert (tmp_path / "mine.txt").read_text() == "someone's book"
