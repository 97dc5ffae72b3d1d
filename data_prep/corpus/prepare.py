"""Corpus directory of books -> sentence shards + manifest.json.

The work per book is `data_prep.corpus.ingest.process_book`; Ray only maps it over groups of files. The driver takes the
groups' summaries in input order, decides which books are duplicates and which rows go to which shard
(`ShardPlanner`), and Ray tasks write the shards from the rows where the groups' tasks left them, so the driver never
carries the corpus's bytes. The output does not depend on the number of workers or on which task finishes first: same
inputs and options give byte-identical shards.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa

from data_prep.corpus.decontaminate import EvaluationOverlap
from data_prep.corpus.dedup import (
    MinHasher,
    NearDuplicateIndex,
    NearDuplicateOptions,
    draw_minhasher,
    minhash_signature,
    shingle_hashes,
)
from data_prep.corpus.ingest import BYTE_ORDER_MARKS, BookResult, IngestOptions, exact_duplicate_of, process_book
from data_prep.corpus.progress import ProgressReporter
from data_prep.corpus.sentences import fallback_notice
from data_prep.corpus.shards import (
    MANIFEST_NAME,
    SHARD_PREFIX,
    SHARD_SCHEMA,
    ShardInfo,
    ShardPlan,
    ShardPlanner,
    row_bytes,
    write_json_atomically,
    write_shard,
)

if TYPE_CHECKING:  # Ray is imported where it runs: what reads only this module's helpers (the engine listing the
    import ray  # corpus files, a GPU machine without Ray) needs no Ray

# 2: near duplicates (status "near_duplicate", "similarity"); 3: a file over max_book_bytes is read as parts, each a
# book and an entry of its own ("big.txt#2/31"); 4: the sentences dropped by length split into too short and too long,
# "decontamination", and per book what it removed
MANIFEST_FORMAT_VERSION = 4
# A group is one Ray task. Aim for ~4 groups per worker so a few big books do not leave workers idle
# at the end, but keep tasks big enough that Ray's per-task overhead (~1 ms) stays invisible and small
# enough that the results of the groups in flight bound the driver's memory. The cap is what keeps that
# memory independent of the corpus size: groups of a fixed size, not a fixed share of the corpus.
_GROUPS_PER_WORKER = 4
_MIN_GROUP_BYTES = 1 << 20
_MAX_GROUP_BYTES = 4 << 20
# and at most this many books: a group's results are held whole, with a fixed cost per book, so 100,000 notes of
# ~140 bytes made 8 groups of 12,500 books, and 2.7 GB peak RSS for the driver and its Ray workers against 1.7 GB
# with this cap.
_MAX_GROUP_BOOKS = 1000
# Groups submitted ahead of the one the driver is classifying, and shards submitted but not yet written, per worker:
# enough to keep every worker busy, few enough that finished-but-unwritten results stay bounded.
_IN_FLIGHT_PER_WORKER = 2
# Shards written per task, in bytes: Ray's cost per task (scheduling, fetching its arguments) is the same for a shard of
# 1 MB, data.shard_bytes' default, as for one of 64 MB.
_WRITE_TASK_BYTES = 16 << 20
# A book is decoded, cleaned and split in memory, at ~26x its size at peak (tests/data_prep/test_bad_input.py:
# 1.3 GB for 50 MB), so a 500 MB file without a line break, or BookCorpus as it is often shipped (two files of 2 GB,
# a sentence per line), would take 13 or 52 GB in one worker. A file bigger than this is read in parts of about this
# size, each a book of its own; 16 MB is far above a novel (0.6 MB on average in gutenberg-raw).
MAX_BOOK_BYTES = 16 << 20
# A part ends at the first paragraph break within this many bytes of its nominal end, else at the first line break,
# sentence end or space there, and at worst between two characters: cuts depend only on the file's bytes.
_CUT_WINDOW_BYTES = 64 << 10
_CUT_SEPARATORS = (b"\n\n", b"\n", b". ", b" ")


def _glob_regex(pattern: str) -> re.Pattern:
    """`pattern` as a regex over relative POSIX paths, with pathlib's meaning (`*`, `?` and `[...]` stay within
    one path component, a `**` component is any number of directories) and ignoring case: a book saved as
    BOOK.TXT is as much a book as book.txt."""
    regex = ""
    for component in pattern.split("/"):
        regex += "(?:[^/]*/)*" if component == "**" else _component_regex(component) + "/"
    return re.compile(regex.removesuffix("/"), re.IGNORECASE)


def _component_regex(component: str) -> str:
    regex, i = "", 0
    while i < len(component):
        char = component[i]
        class_end = component.find("]", i + 2) if char == "[" else -1
        if char == "*":
            regex += "[^/]*"
        elif char == "?":
            regex += "[^/]"
        elif class_end != -1:
            members = component[i + 1:class_end].replace("\\", "\\\\")
            regex += f"[^/{members[1:]}]" if members.startswith("!") else f"[{members}]"
            i = class_end
        else:
            regex += re.escape(char)
        i += 1
    return regex


def list_corpus_files(root: Path, pattern: str) -> list[str]:
    """Relative POSIX paths of everything under `root` matching the glob `pattern` (case-insensitively) that is not
    a directory, sorted, so the order (and hence the shards) does not depend on the filesystem's directory order.

    Directory symlinks are followed, unlike pathlib's `glob("**")`, which would silently leave out a shelf of books
    linked into the corpus; a directory reached a second time (a link loop, or two links to one folder) is not
    entered again. Broken symlinks, FIFOs and other non-regular files are listed too, so that `read_and_process`
    records them as rejected instead of their silently vanishing."""
    regex = _glob_regex(pattern)
    # Without "**" a match lies at a fixed depth: no need to walk below it.
    max_depth = None if "**" in pattern.split("/") else pattern.count("/")
    try:
        visited = {_directory_key(root)}
    except OSError:
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        relative_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        found.extend(prefix + name for name in filenames if regex.fullmatch(prefix + name))
        if max_depth is not None and prefix.count("/") >= max_depth:
            dirnames.clear()
            continue
        dirnames.sort()  # the first path to a twice-linked folder is the one listed, on every filesystem
        keep = []
        for name in dirnames:
            key = _directory_key(Path(dirpath) / name)
            if key not in visited:
                visited.add(key)
                keep.append(name)
        dirnames[:] = keep
    return sorted(found)


def _directory_key(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


class Piece(NamedTuple):
    """A book to read: a whole file (`end` None), or its bytes [start, end) when it is bigger than a book; `reject`:
    why it is rejected unread."""
    book_id: str
    path: str  # relative to the corpus directory
    start: int = 0
    end: int | None = None
    reject: str = ""


def _cut_after(f, offset: int) -> int:
    f.seek(offset)
    window = f.read(_CUT_WINDOW_BYTES)
    for separator in _CUT_SEPARATORS:
        found = window.find(separator)
        if found != -1:
            return offset + found + len(separator)
    # not before a UTF-8 continuation byte (0b10xxxxxx): between two characters
    return offset + next((i for i, byte in enumerate(window) if not 0x80 <= byte < 0xC0), len(window))


def book_id_of(relative_path: str) -> str:
    """A file's book_id: its relative path, with any byte that is not UTF-8 in a name (caf\\xe9.txt saved in Latin-1)
    spelt as its escape, which the shards' UTF-8 columns and the manifest can hold."""
    return relative_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _pieces_of(path_in_corpus: str, path: Path, size: int, max_book_bytes: int) -> list[Piece]:
    book_id = book_id_of(path_in_corpus)
    if size <= max_book_bytes:
        return [Piece(book_id, path_in_corpus)]
    try:
        with open(path, "rb") as f:
            if f.read(4).startswith(BYTE_ORDER_MARKS):  # UTF-16 and UTF-32 cannot be cut at byte values
                return [Piece(book_id, path_in_corpus, 0, size, reject=(
                    f"{size / 1e6:.0f} MB of UTF-16 or UTF-32 text: too big to read whole, and it cannot be cut at "
                    "line breaks; save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8) to have it read in parts"))]
            cuts = [0]
            for nominal in range(max_book_bytes, size, max_book_bytes):
                cut = _cut_after(f, max(nominal, cuts[-1]))
                if cuts[-1] < cut < size:
                    cuts.append(cut)
    except OSError:
        return [Piece(book_id, path_in_corpus)]  # read_and_process rejects it, with the reason
    cuts.append(size)
    parts = len(cuts) - 1
    return [Piece(f"{book_id}#{part}/{parts}", path_in_corpus, start, end)
            for part, (start, end) in enumerate(zip(cuts, cuts[1:]), start=1)]


def plan_pieces(corpus_dir: Path, files: list[str], sizes: list[int],
                max_book_bytes: int) -> tuple[list[Piece], list[int]]:
    """The books to read and their sizes: each file (a path relative to `corpus_dir`) whole, or when bigger than
    `max_book_bytes` in parts of about that size, cut at paragraph or line breaks, each a book of its own
    ("big.txt#2/31")."""
    pieces, piece_sizes = [], []
    for path_in_corpus, size in zip(files, sizes):
        for piece in _pieces_of(path_in_corpus, corpus_dir / path_in_corpus, size, max_book_bytes):
            pieces.append(piece)
            piece_sizes.append(size if piece.end is None else piece.end - piece.start)
    return pieces, piece_sizes


class ProcessedBook(NamedTuple):
    result: BookResult  # without its rows, which stay in the group's result (read_and_process)
    row_bytes: np.ndarray | None  # each kept sentence's share of a shard (data_prep.corpus.shards.row_bytes)
    signature: np.ndarray | None  # MinHash signature of a kept book when near-duplicate detection is on


def special_file_kind(mode: int) -> str | None:
    """What a file of `st_mode` `mode` is when it is not a regular file ("a named pipe (FIFO)", "a device", ...), None
    for a regular file: the one kind that is read, as reading a FIFO blocks until a writer comes and a device such as
    /dev/zero never ends."""
    if stat.S_ISREG(mode):
        return None
    return "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a directory" if stat.S_ISDIR(mode) else \
        "not a regular file"


class NotARegularFile(OSError):
    """A book's path names a FIFO, a device, a socket, ... (special_file_kind): rejected unread."""


def _read_regular_file(path: Path) -> bytes:
    """The file's bytes; raises NotARegularFile, unread, for anything else."""
    kind = special_file_kind(path.stat().st_mode)
    if kind:
        raise NotARegularFile(kind)
    return path.read_bytes()


def _read_piece(corpus_dir: Path, piece: Piece) -> bytes:
    path = corpus_dir / piece.path
    if piece.end is None:
        return _read_regular_file(path)
    with open(path, "rb") as f:
        f.seek(piece.start)
        return f.read(piece.end - piece.start)


def read_and_process(corpus_dir: str, pieces: list[Piece], options: IngestOptions,
                     near_duplicates: NearDuplicateOptions | None = None,
                     hasher: MinHasher | None = None, decontamination: EvaluationOverlap | None = None,
                     ) -> tuple[list[ProcessedBook], list[pa.RecordBatch | None]]:
    """One Ray task: reads and processes a group of books (`plan_pieces`), removing the sentences that overlap
    `decontamination`'s evaluation text, and signs the kept ones for near-duplicate detection when `near_duplicates`
    (with its `hasher`) is given. Returns the books' summaries for the driver and, apart, their rows for the tasks
    that write the shards. A file that cannot be read is a rejected book, not a failed run."""
    summaries, rows = [], []
    for piece in pieces:
        if piece.reject:
            result = BookResult.rejected(piece.book_id, piece.reject, num_bytes=piece.end)
        else:
            try:
                result = process_book(piece.path, _read_piece(Path(corpus_dir), piece), options, book_id=piece.book_id,
                                      decontamination=decontamination)
            except NotARegularFile as exc:
                result = BookResult.rejected(piece.book_id, f"not a regular file ({exc}): skipped unread; only "
                                                            "regular files, or links to them, are read as books")
            except OSError as exc:
                result = BookResult.rejected(piece.book_id, f"unreadable ({type(exc).__name__}: "
                                                            f"{exc.strerror or exc}); fix or remove the file")
        signature = sizes = None
        if result.status == "kept":
            sizes = row_bytes(result.rows)
            if near_duplicates is not None:
                signature = minhash_signature(shingle_hashes(result.rows["text"], near_duplicates.shingle_words),
                                              hasher)
        summaries.append(ProcessedBook(dataclasses.replace(result, rows=None), sizes, signature))
        rows.append(result.rows)
    return summaries, rows


def group_by_bytes(book_ids: list, sizes: list[int], target_bytes: int, max_books: int) -> list[list]:
    """Consecutive runs of books of about `target_bytes` together, at most `max_books` (a bigger book is a group
    alone)."""
    groups, current, current_bytes = [], [], 0
    for book_id, size in zip(book_ids, sizes):
        if current and (current_bytes + size > target_bytes or len(current) == max_books):
            groups.append(current)
            current, current_bytes = [], 0
        current.append(book_id)
        current_bytes += size
    if current:
        groups.append(current)
    return groups


def _books_in_order(corpus_dir: Path, groups: Iterable[list[str]], options: IngestOptions,
                    near_duplicates: NearDuplicateOptions | None, decontamination: EvaluationOverlap | None,
                    max_in_flight: int) -> Iterator[tuple[ProcessedBook, tuple[ray.ObjectRef, int]]]:
    """Runs the groups as Ray tasks and yields each book's summary in input order, with where its rows are (its
    group's rows in the object store, its position there), holding at most `max_in_flight` groups submitted but not
    yet consumed."""
    import ray
    # SPREAD, as the pipeline's shard tasks (pipeline/engine/shard_tasks.py): on a cluster, every node reads books
    # from the start, instead of the driver's node first.
    task = ray.remote(read_and_process).options(num_cpus=1, scheduling_strategy="SPREAD", num_returns=2)
    hasher = draw_minhasher(near_duplicates.num_perm, np.random.default_rng(near_duplicates.seed)) \
        if near_duplicates else None
    in_flight = collections.deque()
    decontamination_ref = ray.put(decontamination)  # once, not with every task: up to a few MB of hashes

    def books_of(refs):
        summaries_ref, rows_ref = refs
        for position, book in enumerate(ray.get(summaries_ref)):
            yield book, (rows_ref, position)

    for group in groups:
        in_flight.append(task.remote(str(corpus_dir), group, options, near_duplicates, hasher, decontamination_ref))
        if len(in_flight) >= max_in_flight:
            yield from books_of(in_flight.popleft())
    while in_flight:
        yield from books_of(in_flight.popleft())


def write_planned_shards(out_dir: str, plans: list[tuple[int, list[tuple[int, int, int, int]]]],
                         *groups_rows: list[pa.RecordBatch]) -> list[ShardInfo]:
    """A Ray task: writes each (index, slices) shard from its (group, book, start, stop) slices of the groups' rows."""
    return [write_shard(out_dir, index, (groups_rows[group][book].slice(start, stop - start)
                                         for group, book, start, stop in slices))
            for index, slices in plans]


class _ShardWrites:
    """Shards planned by the driver, written by Ray tasks from the rows where the groups' tasks left them (on the
    node that holds them, when it can: Ray's default scheduling prefers the node of a task's arguments). A task
    writes `shards_per_task` shards: one task per 1 MB shard cost 12 % more CPU than the driver writing them
    (docs/scaling.md). At most `max_in_flight` tasks at once; `shards` lists the written shards, in order."""

    def __init__(self, out_dir: Path, shards_per_task: int, max_in_flight: int):
        import ray

        self.out_dir, self.shards_per_task, self.max_in_flight = str(out_dir), shards_per_task, max_in_flight
        self._task = ray.remote(write_planned_shards).options(num_cpus=1)
        self._planned: list[ShardPlan] = []
        self._in_flight: collections.deque[ray.ObjectRef] = collections.deque()
        self.shards: list[ShardInfo] = []

    def submit(self, plan: ShardPlan) -> None:
        self._planned.append(plan)
        if len(self._planned) >= self.shards_per_task:
            self._start_task()

    def finish(self) -> None:
        import ray

        if self._planned:
            self._start_task()
        while self._in_flight:
            self.shards += ray.get(self._in_flight.popleft())

    def abandon(self) -> None:
        """After an error: lets the writes already started end (each commits whole or removes its temporary file),
        so none is killed half-way when Ray shuts down; the next run replaces what they wrote."""
        import ray

        if self._in_flight:
            ray.wait(list(self._in_flight), num_returns=len(self._in_flight))

    def _start_task(self) -> None:
        import ray

        # each group's rows passed once, however many of its books the shards hold: ref -> its argument's position
        positions: dict[ray.ObjectRef, int] = {}
        plans = [(plan.index, [(positions.setdefault(rows_ref, len(positions)), book, start, stop)
                               for (rows_ref, book), start, stop in plan.slices])
                 for plan in self._planned]
        self._planned = []
        self._in_flight.append(self._task.remote(self.out_dir, plans, *positions))
        if len(self._in_flight) >= self.max_in_flight:
            self.shards += ray.get(self._in_flight.popleft())


def _file_entry(result: BookResult, status: str, duplicate_of: str | None = None,
                similarity: float | None = None, sentences: int = 0) -> dict:
    entry = {
        "book_id": result.book_id,
        "status": status,
        "title": result.title,
        "author": result.author,
        "encoding": result.encoding,
        "bytes": result.num_bytes,
        "sentences": sentences,
        "sentences_dropped_by_length": result.num_dropped_by_length,
        "sentences_dropped_too_short": result.num_dropped_too_short,
        "sentences_dropped_too_long": result.num_dropped_too_long,
    }
    if result.removed_as_evaluation_text:
        entry["sentences_removed_as_evaluation_text"] = result.num_removed_as_evaluation_text
        entry["evaluation_text_overlapped"] = result.removed_as_evaluation_text
    if result.utf8_replacements:
        entry["invalid_utf8_sequences_replaced"] = result.utf8_replacements
    if result.nuls_removed:
        entry["nul_characters_removed"] = result.nuls_removed
    if duplicate_of:
        entry["duplicate_of"] = duplicate_of
    if similarity is not None:
        entry["similarity"] = round(similarity, 4)  # estimated Jaccard similarity of word 5-gram sets
    if result.reason:
        entry["reason"] = result.reason
    return entry


def _classify(processed: ProcessedBook, first_by_fingerprint: dict[str, str],
              near_duplicate_index: NearDuplicateIndex | None) -> dict:
    """The manifest entry of one book, registering it as the original for later duplicates if kept.
    Exact duplicates are checked first: they are certain and cheap."""
    result, signature = processed.result, processed.signature
    if result.status != "kept":
        return _file_entry(result, result.status)
    duplicate_of = exact_duplicate_of(result, first_by_fingerprint)
    if duplicate_of:
        return _file_entry(result, "duplicate", duplicate_of)
    if near_duplicate_index is not None:
        match = near_duplicate_index.match(signature)
        if match:
            return _file_entry(result, "near_duplicate", *match)
        # A copy: Ray deserialises numpy arrays as views into the task's result in the object store, so
        # keeping the view would pin every group's sentences there, growing memory with the corpus.
        near_duplicate_index.add(result.book_id, signature.copy())
    return _file_entry(result, "kept", sentences=len(processed.row_bytes))


def _no_sentences_message(files: list[dict], options: IngestOptions) -> str:
    reasons = collections.Counter(entry.get("reason", entry["status"]) for entry in files)
    listed = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(3))
    return (f"no sentences left from {len(files)} files ({listed}). Check data.input_format="
            f"{options.input_format!r} matches the files, or widen data.min_tokens={options.min_tokens}/"
            f"data.max_tokens={options.max_tokens}")


def manifest_summary(shard_dir: str | os.PathLike, names_per_reason: int = 3) -> str:
    """The totals of a finished prepare output and its rejected files grouped by reason, the first
    `names_per_reason` names of each, with the path of the manifest that gives every file's full reason."""
    manifest_path = (Path(shard_dir) / MANIFEST_NAME).resolve()
    manifest = json.loads(manifest_path.read_text())
    totals = manifest["totals"]
    lines = [f"prepare: {totals['files_kept']} of {totals['files_read']} files kept, {totals['files_duplicate']} "
             f"duplicates, {totals['files_near_duplicate']} near duplicates, {totals['files_rejected']} rejected; "
             f"every file's fate and reason: {manifest_path}"]
    short, long = totals["sentences_dropped_too_short"], totals["sentences_dropped_too_long"]
    options = manifest["options"]
    lines.append(f"  sentences: {totals['sentences']} kept, {short} dropped as shorter than data.min_tokens="
                 f"{options['min_tokens']} tokens, {long} as longer than data.max_tokens={options['max_tokens']}"
                 + (" (tokens are counted as space-separated runs, each CJK character one: text joined by "
                    "zero-width spaces is one token a sentence)" if short or long else ""))
    by_reason = collections.defaultdict(list)
    for entry in manifest["files"]:
        if entry["status"] == "rejected":
            # "binary file (contains NUL bytes: 20% ...)", "unreadable (FileNotFoundError: ...)": the kind of
            # rejection, without the per-file details that would give each file a group of its own.
            by_reason[re.split(r" \(|: |; ", entry["reason"], maxsplit=1)[0]].append(entry["book_id"])
    for reason, names in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        more = f" and {len(names) - names_per_reason} more" if len(names) > names_per_reason else ""
        lines.append(f"  rejected, {reason} ({len(names)}): {', '.join(names[:names_per_reason])}{more}")
    return "\n".join(lines)


def _decontamination_summary(decontamination: EvaluationOverlap | None, files: list[dict]) -> dict | None:
    """What decontamination removed: sentences in all, and per evaluation source, of the books not rejected for
    something else (a duplicate's sentences are counted in its original's); None when it was off."""
    if decontamination is None:
        return None
    counted = [entry for entry in files if entry["status"] == "kept" or "evaluation text" in entry.get("reason", "")]
    by_source = collections.Counter()
    for entry in counted:
        by_source.update(entry.get("evaluation_text_overlapped", {}))
    return {"ngram": decontamination.n, "sources": list(decontamination.sources),
            "evaluation_units_indexed": len(decontamination),
            "sentences_removed": sum(entry.get("sentences_removed_as_evaluation_text", 0) for entry in counted),
            "sentences_removed_by_source": {name: by_source.get(name, 0) for name in decontamination.sources}}


def _remove_previous_outputs(out_dir: Path) -> None:
    """A previous run's manifest and shards must not outlive this run: the manifest goes first, so a
    reader never sees one describing shards that are being replaced."""
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    for stale in out_dir.glob(f"{SHARD_PREFIX}*"):
        stale.unlink()


def prepare_corpus(
    corpus_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    glob: str = "**/*.txt",
    input_format: str = "raw",
    shard_bytes: int = 256 << 20,
    min_tokens: int = IngestOptions.min_tokens,
    max_tokens: int = IngestOptions.max_tokens,
    nfkc: bool = False,
    chinese_variant: str = "keep",
    near_duplicates: NearDuplicateOptions | None = NearDuplicateOptions(),
    decontamination: EvaluationOverlap | None = None,
    num_workers: int,
    progress_interval_s: float = 10.0,
    max_book_bytes: int = MAX_BOOK_BYTES,
) -> dict:
    """Cleans, splits and deduplicates every book under `corpus_dir` into Arrow shards in `out_dir`.

    The books are the files `list_corpus_files` finds for `glob`: matched ignoring case, through linked folders; a
    file bigger than `max_book_bytes` is read in parts of about that size, each a book ("big.txt#2/31", `plan_pieces`).
    Writes `shard-NNNNN.arrow` files and, last, `manifest.json` (returned as a dict): the options, every
    input file's fate (kept, rejected with a reason, duplicate or near_duplicate of an earlier book), the
    shards with their sha256, totals, and what decontamination removed (per book and per evaluation source).
    `near_duplicates=None` keeps near duplicates (exact duplicates are always dropped); `decontamination` (the run's
    evaluation text, data_prep/corpus/decontaminate.py) removes every sentence that overlaps it. A previous run's
    shards and
    manifest in `out_dir` are replaced. Prints a progress line every `progress_interval_s` seconds and a summary at
    the end. Uses the running Ray instance, or starts a local one with `num_workers` CPUs (and shuts it down
    afterwards); either way at most 2 x `num_workers` groups of files are in flight.
    """
    corpus_dir = Path(corpus_dir).resolve()
    out_dir = Path(out_dir)
    options = IngestOptions(input_format=input_format, min_tokens=min_tokens, max_tokens=max_tokens, nfkc=nfkc,
                            chinese_variant=chinese_variant)
    if options.input_format == "raw" and fallback_notice():
        print(fallback_notice(), flush=True)
    if num_workers < 1:
        raise ValueError(f"num_workers (ray.num_cpus in the pipeline) must be at least 1, got {num_workers}")
    if max_book_bytes < 1:
        raise ValueError(f"max_book_bytes must be at least 1, got {max_book_bytes}")
    planner = ShardPlanner(shard_bytes)  # validates shard_bytes before any work is done
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"corpus directory {corpus_dir} does not exist or is not a directory; "
                                "pass the folder that holds the book files (data.corpus_dir)")
    book_ids = list_corpus_files(corpus_dir, glob)
    if not book_ids:
        raise ValueError(f"no files under {corpus_dir} match data.glob={glob!r}; check the directory "
                         "(data.corpus_dir), or set data.glob to the pattern its books follow (e.g. '**/*.txt')")

    sizes = []
    for book_id in book_ids:
        try:
            sizes.append((corpus_dir / book_id).stat().st_size)
        except OSError:
            sizes.append(0)  # read_and_process records it as unreadable
    pieces, sizes = plan_pieces(corpus_dir, book_ids, sizes, max_book_bytes)
    target_bytes = sum(sizes) // (_GROUPS_PER_WORKER * num_workers)
    groups = group_by_bytes(pieces, sizes, min(max(target_bytes, _MIN_GROUP_BYTES), _MAX_GROUP_BYTES),
                            _MAX_GROUP_BOOKS)

    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_previous_outputs(out_dir)
    progress = ProgressReporter("prepare", len(pieces), sum(sizes), interval_s=progress_interval_s)
    import ray

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=num_workers, include_dashboard=False)
    try:
        files = []
        first_by_fingerprint: dict[str, str] = {}
        near_duplicate_index = NearDuplicateIndex(near_duplicates) if near_duplicates else None
        writes = _ShardWrites(out_dir, max(1, _WRITE_TASK_BYTES // shard_bytes), _IN_FLIGHT_PER_WORKER * num_workers)
        try:
            for processed, rows_at in _books_in_order(corpus_dir, groups, options, near_duplicates, decontamination,
                                                      _IN_FLIGHT_PER_WORKER * num_workers):
                entry = _classify(processed, first_by_fingerprint, near_duplicate_index)
                files.append(entry)
                if entry["status"] == "kept":
                    for plan in planner.add_book(rows_at, processed.row_bytes):
                        writes.submit(plan)
                progress.update(1, entry["bytes"])
            if not any(entry["sentences"] for entry in files):
                raise ValueError(_no_sentences_message(files, options))
            for plan in planner.finish():
                writes.submit(plan)
            writes.finish()
        except BaseException:
            writes.abandon()
            raise
    finally:
        if started_ray:
            ray.shutdown()

    status_counts = collections.Counter(entry["status"] for entry in files)
    manifest = {
        "format_version": MANIFEST_FORMAT_VERSION,
        "corpus_dir": str(corpus_dir),
        "options": {"glob": glob, "shard_bytes": shard_bytes, "max_book_bytes": max_book_bytes,
                    **dataclasses.asdict(options),
                    "near_duplicates": dataclasses.asdict(near_duplicates) if near_duplicates else None},
        "schema": {field.name: str(field.type) for field in SHARD_SCHEMA},
        "totals": {
            "files_read": len(files),
            "files_kept": status_counts["kept"],
            "files_duplicate": status_counts["duplicate"],
            "files_near_duplicate": status_counts["near_duplicate"],
            "files_rejected": status_counts["rejected"],
            "sentences": sum(entry["sentences"] for entry in files),
            "sentences_dropped_by_length": sum(entry["sentences_dropped_by_length"] for entry in files),
            "sentences_dropped_too_short": sum(entry["sentences_dropped_too_short"] for entry in files),
            "sentences_dropped_too_long": sum(entry["sentences_dropped_too_long"] for entry in files),
            "nul_characters_removed": sum(entry.get("nul_characters_removed", 0) for entry in files),
            "input_bytes": sum(entry["bytes"] for entry in files),
            "shards": len(writes.shards),
            "output_bytes": sum(shard.bytes for shard in writes.shards),
        },
        "decontamination": _decontamination_summary(decontamination, files),
        "shards": [dataclasses.asdict(shard) for shard in writes.shards],
        "files": files,
    }
    write_json_atomically(out_dir / MANIFEST_NAME, manifest)

    totals = manifest["totals"]
    progress.finish(f"{totals['files_kept']} kept, {totals['files_duplicate']} duplicates, "
                    f"{totals['files_near_duplicate']} near duplicates, {totals['files_rejected']} rejected, "
                    f"{totals['sentences']} sentences -> {totals['shards']} shards in {out_dir}")
    return manifest
