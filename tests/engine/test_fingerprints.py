"""A stage's cache key follows what decides its outcome: the contents of its input files (and whether they can be read
at all) and the code it runs, with no version number to bump by hand (issue 21, item 1)."""
from __future__ import annotations

import builtins
import functools
import importlib
import importlib.util
import os
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.engine import fingerprints
from pipeline.engine.dag import Stage, execute_stage, plan, stage_hashes
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.stages import STAGES
from tests.helpers import tiny_config


def _fingerprint(corpus: Path, tmp_path: Path) -> str:
    return files_fingerprint(corpus, "*.txt", tmp_path / "cache")


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "books"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The ship sailed at dawn.\n")
    (corpus / "b.txt").write_text("Old men watched it go.\n")
    return corpus


def test_a_content_change_that_keeps_size_and_mtime_changes_the_fingerprint(tmp_path):
    corpus = _corpus(tmp_path)
    book = corpus / "a.txt"
    before = _fingerprint(corpus, tmp_path)
    st = book.stat()
    book.write_text("The boat sailed at dusk.\n")  # same length
    os.utime(book, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (book.stat().st_size, book.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert _fingerprint(corpus, tmp_path) != before


def _unreadable(name: str, opened: list[str] | None = None):
    """`open` as for a file whose permissions forbid reading it (tests run as root, for whom mode bits do not)."""
    def fake_open(path, *args, **kwargs):
        if opened is not None:
            opened.append(Path(path).name)
        if Path(path).name == name:
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)
    return fake_open


def test_a_book_unreadable_then_fixed_changes_the_prepare_hash(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path)
    book = Path(cfg.data.corpus_dir) / "book_01.txt"
    with monkeypatch.context() as patched:
        patched.setattr(fingerprints, "open", _unreadable(book.name), raising=False)
        rejected = stage_hashes(cfg, STAGES, ["prepare"])["prepare"]
    fixed = stage_hashes(cfg, STAGES, ["prepare"])["prepare"]
    assert fixed != rejected  # the fixed book is read again, not "stage prepare: cached"
    assert stage_hashes(cfg, STAGES, ["prepare"])["prepare"] == fixed


@pytest.mark.skipif(importlib.util.find_spec("blingfire") is None, reason="blingfire is not installed")
@pytest.mark.parametrize("input_format", ["raw", "sentence_per_line"])
def test_the_prepare_hash_names_the_sentence_splitter_that_raw_text_needs(tmp_path, monkeypatch, input_format):
    from data_prep.corpus import sentences

    cfg = tiny_config(tmp_path, [f"data.input_format={input_format}"])

    def hashes(blingfire_unavailable: str) -> dict[str, str]:
        monkeypatch.setattr(sentences, "blingfire_unavailable", lambda: blingfire_unavailable)
        return stage_hashes(cfg, STAGES, ["bert_tokenizer"])

    on_x86_64, on_aarch64 = hashes(""), hashes("blingfire ships x86-64 binaries only")
    # the two split differently (data_prep/corpus/sentences.py): the shards, and all that is made of them, are not
    # shared
    assert (on_x86_64["prepare"] != on_aarch64["prepare"]) == (input_format == "raw")
    assert (on_x86_64["bert_tokenizer"] != on_aarch64["bert_tokenizer"]) == (input_format == "raw")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode bits")
def test_a_book_made_readable_by_chmod_changes_the_fingerprint(tmp_path):
    corpus = _corpus(tmp_path)
    (corpus / "a.txt").chmod(0)
    rejected = _fingerprint(corpus, tmp_path)
    (corpus / "a.txt").chmod(0o644)
    assert _fingerprint(corpus, tmp_path) != rejected


def test_file_digests_are_memoised_until_a_file_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprints, "SETTLE_NS", 0)  # the files just written count as settled
    corpus = _corpus(tmp_path)
    first = _fingerprint(corpus, tmp_path)
    opened: list[str] = []
    monkeypatch.setattr(fingerprints, "open", _unreadable("none", opened), raising=False)
    assert _fingerprint(corpus, tmp_path) == first
    assert opened == []  # 66 MB of books are not read again at every start
    (corpus / "b.txt").write_text("Old men watched it leave.\n")
    assert _fingerprint(corpus, tmp_path) != first
    assert opened == ["b.txt"]


def _planned_within(cfg, seconds: float):
    """plan(cfg, STAGES), failing the test where planning has not ended within `seconds` (a blocked read)."""
    planned = []
    worker = threading.Thread(target=lambda: planned.append(plan(cfg, STAGES)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert planned, f"planning had not ended after {seconds} s"
    return planned[0]


def test_a_fifo_or_a_link_to_dev_zero_in_the_corpus_is_keyed_by_name_and_kind_never_read(tmp_path):
    """Planning (also with pipeline.dry_run=true) opened and hashed every file before prepare's
    regular-file check, and hung on a FIFO (no writer) or a link to /dev/zero (no end)."""
    cfg = tiny_config(tmp_path, ["pipeline.dry_run=true", "pipeline.until=prepare"])
    corpus = Path(cfg.data.corpus_dir)
    without = plan(cfg, STAGES).hashes["prepare"]
    os.mkfifo(corpus / "pipe.txt")
    (corpus / "zeros.txt").symlink_to("/dev/zero")
    planned = _planned_within(cfg, 20)
    assert {name: digest for name, digest in planned.input_files["prepare"].files.items()
            if Path(name).name in ("pipe.txt", "zeros.txt")} == {
        str(corpus / "pipe.txt"): "skipped, a named pipe (FIFO)", str(corpus / "zeros.txt"): "skipped, a device"}
    assert planned.hashes["prepare"] != without  # added: new work, by name and kind
    (corpus / "zeros.txt").unlink()
    os.mkfifo(corpus / "zeros.txt")
    assert _planned_within(cfg, 20).hashes["prepare"] != planned.hashes["prepare"]  # another kind


def test_a_book_whose_file_name_is_not_utf8_is_planned_and_its_digest_memoised(tmp_path, monkeypatch):
    """A book named caf\\xe9.txt (Latin-1) crashed planning with UnicodeEncodeError, writing the
    digest memo, which holds the name."""
    monkeypatch.setattr(fingerprints, "SETTLE_NS", 0)  # the files just written count as settled: memoised
    corpus = _corpus(tmp_path)
    (corpus / os.fsdecode(b"caf\xe9.txt")).write_text("The cafe opened at noon.\n")
    first = _fingerprint(corpus, tmp_path)
    opened: list[str] = []
    monkeypatch.setattr(fingerprints, "open", _unreadable("none", opened), raising=False)
    assert _fingerprint(corpus, tmp_path) == first
    assert opened == []  # the memo, read back, holds the name as it is on disk


def _write_module(path: Path, body: str) -> None:
    path.write_text(textwrap.dedent(body))


def _stage_config(tmp_path: Path):
    return OmegaConf.create({"logger": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
                             "paths": {"cache_dir": str(tmp_path / "cache")},
                             "pipeline": {"stages": ["edited"], "until": None, "force": [], "dry_run": False}})


def _edited_stage(name: str) -> dict[str, Stage]:
    module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    return {"edited": Stage("edited", module.run)}


def test_a_stage_whose_code_changes_is_rerun(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "edited_stage.py"
    _write_module(module, """
        def run(ctx):
            return {"answer": 41}
    """)
    cfg = _stage_config(tmp_path)
    stages = _edited_stage("edited_stage")
    first = plan(cfg, stages)
    execute_stage(stages, cfg, "edited", first.hashes["edited"], first.dirs["edited"], {}, None)
    assert plan(cfg, stages).cached["edited"]
    _write_module(module, """
        def run(ctx):
            return {"answer": 4200}
    """)
    stages = _edited_stage("edited_stage")
    edited = plan(cfg, stages)
    assert edited.hashes["edited"] != first.hashes["edited"] and not edited.cached["edited"]


def test_a_harness_bound_to_a_task_changes_version_with_the_tasks_code(tmp_path, monkeypatch):
    """`partial(pretrain, task=FamilyPretraining())`: the family's task code is the stage's code too, although the
    harness's module never imports it."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def version(value: int) -> str:
        _write_module(tmp_path / "bound_task.py", f"""
            class Task:
                answer = {value}
        """)
        module = importlib.reload(sys.modules["bound_task"]) if "bound_task" in sys.modules \
            else importlib.import_module("bound_task")
        return fingerprints.code_version(functools.partial(fingerprints.code_version, task=module.Task()))

    assert version(41) != version(4200)
    assert version(41) == version(41)


def test_a_change_in_a_module_imported_two_levels_down_changes_the_code_version(tmp_path, monkeypatch):
    """A stage's module imports helpers that import others: an edit at any depth is a code change. The repository's
    packages are those of tmp_path here, so that the test edits no file of the real one."""
    monkeypatch.setattr(fingerprints, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(fingerprints, "CODE_PACKAGES", ("fp_helpers",))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fp_helpers").mkdir()
    _write_module(tmp_path / "fp_helpers" / "__init__.py", "")
    _write_module(tmp_path / "fp_helpers" / "first.py", """
        def answer():
            from fp_helpers.second import VALUE  # lazy imports count too
            return VALUE
    """)
    _write_module(tmp_path / "fp_helpers" / "second.py", "VALUE = 41\n")
    _write_module(tmp_path / "deep_stage.py", """
        from fp_helpers import first
        import json

        def run(ctx):
            return {"answer": first.answer()}
    """)
    fn = importlib.import_module("deep_stage").run
    before = fingerprints.code_version(fn)
    assert set(fingerprints.code_files(tmp_path / "deep_stage.py")) == {
        tmp_path / "deep_stage.py", tmp_path / "fp_helpers" / "__init__.py", tmp_path / "fp_helpers" / "first.py",
        tmp_path / "fp_helpers" / "second.py"}
    assert fingerprints.code_version(fn) == before
    _write_module(tmp_path / "fp_helpers" / "second.py", "VALUE = 4242\n")
    assert fingerprints.code_version(fn) != before


def test_the_prepare_stage_runs_the_corpus_code_and_not_the_models():
    repo = fingerprints.REPO_ROOT
    files = {p.relative_to(repo).as_posix() for p in fingerprints.code_files(repo / "pipeline" / "corpus.py")}
    assert {"pipeline/corpus.py", "data_prep/corpus/prepare.py", "data_prep/corpus/ingest.py",
            "pipeline/engine/dag.py"} <= files
    # models/__init__.py holds only the ignore index data_prep writes into CoNLL labels (read by decontamination)
    assert not any(f.startswith(("models/", "pipeline/bert/")) for f in files - {"models/__init__.py"})
