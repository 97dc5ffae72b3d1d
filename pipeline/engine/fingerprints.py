"""What a stage's cache key is made of besides its settings: the contents of the files it reads from outside the
cache, and the source code it runs.

A key of names, sizes and modification times (as before) missed two kinds of change: a book rejected as unreadable
stayed rejected after its permissions were fixed ("stage prepare: cached"), and an edit that keeps size and mtime
was invisible. Hand-bumped stage versions missed every code change whose bump was forgotten. Hashing is what git does
for both, with git's trick for cost: a file is hashed once per (inode, size, mtime, ctime, mode) and the digest kept.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from data_prep.corpus.prepare import list_corpus_files, special_file_kind
from data_prep.corpus.shards import write_json_atomically

UNREADABLE = "unreadable"
REPO_ROOT = Path(__file__).resolve().parents[2]
# the repository's code; anything else is a dependency
CODE_PACKAGES = ("pipeline", "data_prep", "models", "conventions")
# A digest is kept only for a file unchanged this long: a later edit in the same tick of the file system's clock would
# keep the whole stat identity (git's "racy clean" problem), so a fresh file is hashed again next time.
SETTLE_NS = 2_000_000_000


def stat_identity(st: os.stat_result) -> list[int]:
    """What git's index keeps of a file to tell that it has not changed since it was hashed."""
    # ctime too: unlike mtime it cannot be set back (os.utime), so a rewrite that restores size and mtime still counts
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode]


def skipped(kind: str) -> str:
    """The digest of a file that is not a regular file (data_prep.corpus.prepare.special_file_kind): its kind, never
    its contents, so adding or removing one changes a key by its name and kind alone."""
    return f"skipped, {kind}"


def _open_without_blocking(path: str, flags: int) -> int:
    # opening a FIFO for reading would wait for a writer; the fstat after it tells the FIFO apart
    return os.open(path, flags | os.O_NONBLOCK)


def content_digest(path: Path) -> str:
    """sha256 of a regular file's bytes, `skipped(kind)` for anything else (unread: a FIFO blocks its reader, /dev/zero
    never ends), UNREADABLE where it cannot be opened."""
    try:
        with open(path, "rb", opener=_open_without_blocking) as f:
            kind = special_file_kind(os.fstat(f.fileno()).st_mode)
            return skipped(kind) if kind else hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        # The readability is part of the outcome (prepare rejects the book): fixing it must change the key.
        return UNREADABLE


def memoised_digests(paths: list[Path], cache_dir: str | Path, memo_key: str) -> list[str]:
    """content_digests of `paths`, memoised under `cache_dir`'s file_digests/ in one memo per `memo_key` (what the
    paths are a listing of: a corpus folder and its pattern, a task's files, a checkpoint)."""
    memo = Path(cache_dir) / "file_digests" / f"{hashlib.sha256(memo_key.encode()).hexdigest()[:16]}.json"
    return content_digests(paths, memo)


def content_digests(paths: list[Path], memo_file: Path) -> list[str]:
    """sha256 of each file's bytes, or UNREADABLE. Digests are memoised in `memo_file` by path and stat identity;
    the memo is rewritten with exactly `paths`, so it does not grow with files long gone. An unreadable file is
    never memoised: permissions can change without touching the file's identity (e.g. its directory's)."""
    now = time.time_ns()
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    digests, kept = [], {}
    for path in paths:
        try:
            st = path.stat()
        except OSError:  # a broken link: repairing it is new work
            digests.append(UNREADABLE)
            continue
        kind = special_file_kind(st.st_mode)
        if kind:  # a socket, which open() refuses, is skipped as a FIFO is
            digests.append(skipped(kind))
            continue
        identity = stat_identity(st)
        known = memo.get(str(path))
        digest = known[1] if known and known[0] == identity else content_digest(path)
        digests.append(digest)
        if digest != UNREADABLE and now - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_NS:
            kept[str(path)] = [identity, digest]
    if kept != memo:
        try:
            memo_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the memo names the input files
            write_json_atomically(memo_file, kept)
        except OSError:
            pass  # a read-only cache still serves its runs; the digests are taken again next time
    recording = _recording.get()
    if recording is not None:
        recording.update(zip(map(str, paths), digests))
    return digests


def files_fingerprint(root: Path, pattern: str, cache_dir: str | Path) -> str:
    """Names and contents of the input files, listed as prepare lists them (pipeline/engine/fingerprints.py; a file
    that cannot be read, e.g. a broken link, counts as such, and one that is not a regular file, a FIFO or a device,
    by its kind, unread): a changed corpus is new work, and so is a fixed one. Digests are memoised under
    `cache_dir`."""
    names = list_corpus_files(root, pattern)
    listing = list(zip(names, memoised_digests([root / name for name in names], cache_dir, f"{root}\0{pattern}")))
    return hashlib.sha256(json.dumps([str(root), listing]).encode()).hexdigest()



_recording: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("recorded_digests", default=None)


@contextlib.contextmanager
def recorded_digests() -> Iterator[dict[str, str]]:
    """path -> digest of every file that content_digests hashed inside the block: the files a stage's fingerprint
    read, so that a change to them after planning can be named file by file (engine/dag.py)."""
    files: dict[str, str] = {}
    token = _recording.set(files)
    try:
        yield files
    finally:
        _recording.reset(token)


@functools.cache
def _parsed(path: Path, identity: tuple[int, ...]) -> tuple[str, tuple[Path, ...]]:
    """A source file's sha256 and the repository's module files it imports (at any depth of the file, lazy imports
    inside functions included); cached per file version."""
    source = path.read_bytes()
    names = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:  # the repository imports absolutely
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    files = []
    for name in names:
        if name.split(".")[0] in CODE_PACKAGES:
            base = REPO_ROOT.joinpath(*name.split("."))
            # `from pkg import name`: `pkg.name` is a module file, or else an attribute of pkg's own file
            files += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()]
    return hashlib.sha256(source).hexdigest(), tuple(dict.fromkeys(files))


def code_files(module_file: Path) -> dict[Path, str]:
    """`module_file` and every module file of the repository it imports, directly or through others, with the
    sha256 of each one's source."""
    found: dict[Path, str] = {}
    todo = [module_file.resolve()]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        st = path.stat()
        found[path], imports = _parsed(path, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        todo += imports
    return found


def _modules_of(fn: Callable) -> set[str]:
    """The modules whose code a stage function runs: its own, and for a functools.partial (the pretraining harness
    bound to a family's task, `partial(pretrain, task=ElmoPretraining())`) the wrapped function's and those of the
    bound arguments' classes or functions."""
    if not isinstance(fn, functools.partial):
        return {fn.__module__}
    bound = [*fn.args, *fn.keywords.values()]
    return {fn.func.__module__, *(getattr(v, "__module__", None) or type(v).__module__ for v in bound
                                  if callable(v) or type(v).__module__ != "builtins")}


def code_version(fn: Callable) -> str:
    """The version of a stage function's code: a hash of the source of its module and of the repository's modules
    that module imports, directly or through others. Coarser than the function itself (an edit anywhere in those
    modules reruns the stage), never finer: no change to code the stage runs is missed. Dependencies outside the
    repository (torch, tokenizers, ...) are not covered; after upgrading one, rerun with pipeline.force."""
    files: dict[Path, str] = {}
    for module_name in _modules_of(fn):
        files.update(code_files(Path(sys.modules[module_name].__file__)))
    digest = hashlib.sha256()
    for path, source_digest in sorted(files.items()):
        name = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name
        digest.update(f"{name}\0{source_digest}\n".encode())
    return digest.hexdigest()[:16]
