"""Build an N-GB tree of synthetic raw Gutenberg books from a directory of real ones, for measuring the data stages
at book-corpus scale (BookCorpus is ~4.5 GB).

    python benchmarks/make_scale_corpus.py --source ../shared/data/books/gutenberg-raw --out /tmp/scale1g --size 1GB

Each synthetic book keeps the licence header and footer of one real book (its Title line renamed, so every book has
its own title) and a body of paragraphs drawn at random from all the real books, as they are, hard wraps included.
So prepare has its real work to do (licence markers, reflow, sentence splitting) and its duplicate
detectors keep the books apart: two synthetic books share a paragraph only by chance, far below the 0.8 MinHash
Jaccard threshold, where N copies of the same books would be folded into one. Book k depends only on (seed, k) and
the source files, so a tree is reproducible and can be grown or regenerated in parallel. Written books are the
number asked for: none is dropped here (the prepare stage's manifest says how many it kept). The tree's parameters
are recorded in scale_corpus.json next to the books; a second run with the same ones reuses the tree
(bench_data.py --scale does so too).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_prep.corpus.ingest import strip_gutenberg_boilerplate  # noqa: E402

# A real book of this collection is ~0.6 MB (66 MB / 108); synthetic books are about that size.
DEFAULT_BOOK_BYTES = 600_000
RECORD = "scale_corpus.json"  # a tree's parameters, next to its books
_BLANK_LINES = re.compile(r"\n[ \t]*\n")
_TITLE = re.compile(r"^Title:[^\n]*(?:\n[ \t]+\S[^\n]*)*", re.MULTILINE)


@dataclass(frozen=True)
class SourceBook:
    header: str             # up to and including the start marker's line
    paragraphs: list[str]   # the body's blocks between blank lines, hard-wrapped as in the file
    footer: str             # from the end marker on


def read_source(path: Path) -> SourceBook:
    """One real book split into its licence header, body paragraphs and footer."""
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    header, body = strip_gutenberg_boilerplate(text)
    # header ends where the start marker's line begins: keep that line too
    head = text[:text.find("\n", len(header)) + 1] if header else ""
    paragraphs = [p.strip("\n") for p in _BLANK_LINES.split(body) if p.strip()]
    footer = text[text.rfind(paragraphs[-1]) + len(paragraphs[-1]):] if paragraphs else ""
    return SourceBook(head, paragraphs, footer)


def parse_size(size: str) -> int:
    """'1GB', '500MB', '2.5GB' or a number of bytes."""
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    size = size.strip().upper()
    for unit, factor in units.items():
        if size.endswith(unit):
            return int(float(size[:-len(unit)]) * factor)
    return int(size)


def synthetic_book(sources: list[SourceBook], index: int, seed: int, book_bytes: int = DEFAULT_BOOK_BYTES) -> str:
    """Book `index`: one source's header (retitled) and footer around paragraphs drawn from all sources."""
    rng = random.Random(f"{seed}:{index}")  # a string seed: stable across Python versions and processes
    frame = sources[rng.randrange(len(sources))]
    header = _TITLE.sub(f"Title: Synthetic Book {index:07d}", frame.header, count=1) if frame.header else ""
    pool = [s for s in sources if s.paragraphs]
    body, size = [], 0
    while size < book_bytes:
        book = pool[rng.randrange(len(pool))]
        paragraph = book.paragraphs[rng.randrange(len(book.paragraphs))]
        body.append(paragraph)
        size += len(paragraph) + 2
    return header + "\n\n" + "\n\n".join(body) + "\n\n" + frame.footer


def write_corpus(source_dir: Path, out: Path, total_bytes: int, seed: int = 0,
                 book_bytes: int = DEFAULT_BOOK_BYTES, books_per_dir: int = 1000) -> dict:
    """Synthetic books until `total_bytes` are written, `books_per_dir` per sub-directory (a flat directory of
    thousands of files is slow to list on some filesystems). Returns what was written."""
    sources = [read_source(p) for p in sorted(source_dir.glob("**/*.txt"))]
    if not any(s.paragraphs for s in sources):
        raise ValueError(f"no book with a body under {source_dir}; point --source at a directory of Gutenberg .txt")
    written, index = 0, 0
    while written < total_bytes:
        data = synthetic_book(sources, index, seed, book_bytes).encode("utf-8")
        path = out / f"part-{index // books_per_dir:04d}" / f"book-{index:07d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written += len(data)
        index += 1
    return {"books": index, "bytes": written, "sources": len(sources), "seed": seed}


def build_tree(source_dir: Path, out: Path, total_bytes: int, seed: int = 0,
               book_bytes: int = DEFAULT_BOOK_BYTES) -> dict:
    """write_corpus into `out`, unless `out` already holds a complete tree of the same parameters. Returns the tree's
    record, `reused` telling which.

    The record is written before the first book and marked complete after the last, so a build that was cut short is
    built again, and so is a tree of other parameters; a directory with files but no record is someone else's and is
    never removed."""
    wanted = {"source": str(source_dir.resolve()), "bytes": total_bytes, "seed": seed, "book_bytes": book_bytes}
    record_path = out / RECORD
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("parameters") == wanted and record.get("complete"):
            return {**record, "reused": True}
        shutil.rmtree(out)
    elif out.is_dir() and any(out.iterdir()):
        raise SystemExit(f"{out} holds files but no {RECORD}, so it is not a tree make_scale_corpus.py built; pass an "
                         "empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps({"parameters": wanted, "complete": False}))
    record = {"parameters": wanted, "complete": True,
              "written": write_corpus(source_dir, out, total_bytes, seed, book_bytes)}
    record_path.write_text(json.dumps(record, indent=1))
    return {**record, "reused": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="directory of real Gutenberg .txt books")
    parser.add_argument("--out", type=Path, required=True,
                        help="where to write the synthetic tree: a new or empty directory, or one of its trees")
    parser.add_argument("--size", default="1GB", help="total size: 1GB, 500MB, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--book-bytes", type=int, default=DEFAULT_BOOK_BYTES)
    args = parser.parse_args()
    tree = build_tree(args.source, args.out, parse_size(args.size), args.seed, args.book_bytes)
    print(f"{'reused' if tree['reused'] else 'wrote'} {args.out}: {tree['written']}")


if __name__ == "__main__":
    main()
