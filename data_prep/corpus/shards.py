"""Sentence shards: Arrow IPC files, one row per sentence, books kept whole and in order.

The IPC *file* format (not the stream format, not Parquet) because it can be memory-mapped and read
zero-copy (https://arrow.apache.org/docs/python/ipc.html#efficiently-writing-and-reading-arrow-data),
so dataloader workers share the page cache instead of each holding a copy. Uncompressed for the same
reason: compressed buffers must be decompressed into private memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Hashable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SHARD_SCHEMA = pa.schema([
    ("book_id", pa.string()),
    ("title", pa.string()),
    ("paragraph_index", pa.int32()),
    ("sentence_index", pa.int32()),  # within the book
    ("text", pa.string()),
])
MANIFEST_NAME = "manifest.json"
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".arrow"
TMP_SUFFIX = ".tmp"
# Rows are buffered and written as one record batch per this many bytes: batches of a few MiB keep the
# per-batch metadata negligible and the mapped table's chunk count small, while bounding the buffer.
_WRITE_BATCH_BYTES = 8 << 20
# Fixed per-row cost in the Arrow buffers: two int32 columns plus three int32 string offsets.
_FIXED_ROW_BYTES = 4 + 4 + 3 * 4


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:05d}{SHARD_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    file: str
    rows: int
    bytes: int
    sha256: str
    first_book: str
    last_book: str


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def temp_path_for(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def commit_temp_file(tmp: Path, path: Path) -> None:
    """fsyncs `tmp` and renames it over `path`: a killed run leaves either no file, the old one or the
    complete new one, never half of it (os.replace is atomic within a filesystem; the directory fsync
    makes the rename itself durable)."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def atomic_arrow_file(path: str | os.PathLike, schema: pa.Schema) -> Iterator[pa.ipc.RecordBatchFileWriter]:
    """An uncompressed Arrow IPC file writer (memory-mappable, zero-copy reads) that writes to a temporary name and
    commits on success; on an exception the temporary file is removed, so no reader ever sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            yield writer
        commit_temp_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# A file name that is not UTF-8 (caf\xe9.txt in Latin-1) reaches Python as a lone surrogate ("caf\udce9.txt"), which
# UTF-8 cannot encode.
_LONE_SURROGATE = re.compile("[\\ud800-\\udfff]")


def write_json_atomically(path: Path, obj) -> None:
    """JSON committed like a shard; the temporary name carries the process id, so concurrent writers of one
    path (two runs of the pipeline) never write into each other's temporary file. A lone surrogate is written as
    JSON's escape (\\udce9), which reads back as the same string."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}{TMP_SUFFIX}")
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    text = _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        commit_temp_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def book_rows(book_id: str, title: str, paragraph_index: np.ndarray, text: pa.StringArray) -> pa.RecordBatch:
    """One book's rows as a record batch of SHARD_SCHEMA: its sentences `text`, in order, numbered 0..n-1."""
    n = len(text)
    repeat = pa.array(np.zeros(n, dtype=np.int32))  # book_id and title are one value per book
    return pa.record_batch([
        pa.array([book_id], pa.string()).take(repeat),
        pa.array([title], pa.string()).take(repeat),
        pa.array(paragraph_index, pa.int32()),
        pa.array(np.arange(n, dtype=np.int32)),
        text,
    ], schema=SHARD_SCHEMA)


def row_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Each row's share of the Arrow buffers, the unit of the shard size budget."""
    strings = sum(pc.binary_length(batch[name]).to_numpy() for name in ("book_id", "title", "text"))
    return strings.astype(np.int64) + _FIXED_ROW_BYTES


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The rows of shard number `index`: (book, start, stop) slices of the books' rows, in order; `book` is whatever
    key the caller gave `ShardPlanner.add_book`."""
    index: int
    slices: tuple[tuple[Hashable, int, int], ...]


class ShardPlanner:
    """Decides which rows of the books, added in order, go to `shard-00000.arrow`, `shard-00001.arrow`, ...

    A shard is closed before a book that would push it past `shard_bytes` (of Arrow data; the file adds a few KiB of
    metadata), so a book never straddles two shards, except a book larger than a whole shard, whose rows continue, in
    order, into the following shard(s). Only the rows' sizes pass through it: the rows stay where they were made (a
    Ray task's result in prepare) and each shard is written by whichever process `write_shard` runs in, so no single
    process has to carry the corpus's bytes (docs/scaling.md).
    """

    def __init__(self, shard_bytes: int):
        if shard_bytes <= 0:
            raise ValueError(f"data.shard_bytes must be positive, got {shard_bytes}; use a target size such as "
                             "1_000_000")
        self.shard_bytes = shard_bytes
        self._index = 0
        self._slices: list[tuple[Hashable, int, int]] = []
        self._used = 0  # bytes of rows in the open shard

    def add_book(self, book: Hashable, sizes: np.ndarray) -> list[ShardPlan]:
        """Places one book's rows, of `sizes` bytes each (`row_bytes(rows)`); returns the shards this closed."""
        closed = []
        if not len(sizes):
            return closed
        if self._used and self._used + int(sizes.sum()) > self.shard_bytes:
            closed.append(self._close())
        start = 0
        while start < len(sizes):
            cumulative = np.cumsum(sizes[start:])
            # At least one row, or a single row larger than a whole shard would never be placed.
            take = max(1, int(np.searchsorted(cumulative, self.shard_bytes - self._used, side="right")))
            self._slices.append((book, start, start + take))
            self._used += int(cumulative[take - 1])
            start += take
            if start < len(sizes):
                closed.append(self._close())
        return closed

    def finish(self) -> list[ShardPlan]:
        """The last, open shard, if it has rows."""
        return [self._close()] if self._slices else []

    def _close(self) -> ShardPlan:
        plan = ShardPlan(self._index, tuple(self._slices))
        self._index, self._slices, self._used = self._index + 1, [], 0
        return plan


def write_shard(out_dir: str | os.PathLike, index: int, batches: Iterable[pa.RecordBatch]) -> ShardInfo:
    """Writes the rows of `batches`, in order, as shard `index` of `out_dir` (committed atomically: a killed run
    leaves no half shard), and describes it for the manifest. Memory is bounded by one write batch."""
    path = Path(out_dir) / shard_name(index)
    rows, first_book, last_book = 0, None, None
    with atomic_arrow_file(path, SHARD_SCHEMA) as writer:
        buffer, buffered = [], 0
        for batch in batches:
            if not batch.num_rows:
                continue
            first_book = first_book or batch["book_id"][0].as_py()
            last_book = batch["book_id"][-1].as_py()
            rows += batch.num_rows
            buffer.append(batch)
            buffered += int(row_bytes(batch).sum())
            if buffered >= _WRITE_BATCH_BYTES:
                # One contiguous batch instead of one per book keeps the mapped table's chunk count low.
                writer.write_batch(pa.concat_batches(buffer))
                buffer, buffered = [], 0
        if buffer:
            writer.write_batch(pa.concat_batches(buffer))
    return ShardInfo(file=path.name, rows=rows, bytes=path.stat().st_size, sha256=file_sha256(path),
                     first_book=first_book or "", last_book=last_book or "")


def shard_entries(shard_dir: str | os.PathLike) -> list[dict]:
    """The shards of a finished run, in order, as listed in its manifest (ShardInfo's fields: file, rows, ...).

    The manifest is written last, so its absence means the run that filled this directory did not
    finish; reading whatever shards are there would silently train on part of the corpus.
    """
    manifest_path = Path(shard_dir) / MANIFEST_NAME
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{manifest_path} not found: {shard_dir} is not a finished prepare_corpus output "
            "(the run may have been interrupted); run data_prep.corpus.prepare.prepare_corpus again"
        )
    return json.loads(manifest_path.read_text())["shards"]


def shard_paths(shard_dir: str | os.PathLike) -> list[Path]:
    """The paths of the shards of a finished run, in order (shard_entries)."""
    return [Path(shard_dir) / shard["file"] for shard in shard_entries(shard_dir)]


def open_shards(shard_dir: str | os.PathLike) -> pa.Table:
    """All shards as one table, memory-mapped: no row is copied into process memory until it is read."""
    tables = [pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all() for path in shard_paths(shard_dir)]
    return pa.concat_tables(tables) if tables else SHARD_SCHEMA.empty_table()


def shard_batches(shard_dir: str | os.PathLike) -> Iterator[pa.RecordBatch]:
    """The shards' record batches in order, one shard memory-mapped at a time. A map's pages that have been read stay
    in the process's RSS until it is closed: over open_shards' one table of all shards, reading every row once grew
    the tokenizer stage to 1.5 GB at 1 GB of books (2.5 GB at 2 GB); here a shard's pages go when the next is opened."""
    for path in shard_paths(shard_dir):
        with pa.memory_map(str(path), "r") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def sampled_texts(shard_dir: str | os.PathLike, max_rows: int | None) -> tuple[int, Iterator[str]]:
    """(k, the texts of k sentences of the shards): all of them, or with `max_rows` at most that many, evenly spaced
    through the corpus (row i is taken when floor(i k / n) steps up), so every stretch of it, every book, gives its
    share. What a tokenizer trainer needs to bound its memory and time, as SentencePiece's `input_sentence_size`
    does; the sample is streamed one record batch at a time, one shard mapped at a time (shard_batches), instead of
    held (SentencePiece's reservoir sampling holds it), and is the same on every run, without a seed."""
    n = sum(shard["rows"] for shard in shard_entries(shard_dir))  # the manifest counts them
    k = n if max_rows is None else min(max_rows, n)

    def texts() -> Iterator[str]:
        start = 0
        for batch in shard_batches(shard_dir):
            rows = np.arange(start, start + batch.num_rows, dtype=np.int64)
            start += batch.num_rows
            column = batch.column("text")
            if k < n:
                column = column.filter(pa.array((rows + 1) * k // n > rows * k // n))
            yield from column.to_pylist()

    return k, texts()


class Book(NamedTuple):
    book_id: str
    title: str
    paragraphs: list[list[str]]  # sentences, grouped by paragraph, in order


def iter_books(shard_dir: str | os.PathLike) -> Iterator[Book]:
    """Yields the books in shard order, one record batch in memory at a time (plus the current book,
    which may continue across batches and shards)."""
    book = None
    last_paragraph = None
    for batch in shard_batches(shard_dir):
        columns = batch.select(["book_id", "title", "paragraph_index", "text"]).to_pydict()
        for book_id, title, paragraph_index, text in zip(*columns.values()):
            if book is None or book_id != book.book_id:
                if book is not None:
                    yield book
                book, last_paragraph = Book(book_id, title, []), None
            if paragraph_index != last_paragraph:
                book.paragraphs.append([])
                last_paragraph = paragraph_index
            book.paragraphs[-1].append(text)
    if book is not None:
        yield book
