"""Every kind of bad input gets a clear outcome through `prepare_corpus`: an error that says what to do,
or a rejected file with a reason in the manifest. Never a traceback from deep inside, never a file that
silently disappears."""
import codecs
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import ray

import data_prep.corpus.prepare as prepare_module
from data_prep.corpus.dedup import NearDuplicateOptions
from data_prep.corpus.prepare import MAX_BOOK_BYTES, manifest_summary, plan_pieces, prepare_corpus
from data_prep.corpus.shards import open_shards
from data_prep.examples import elmo_examples, skip_thought_examples
from pipeline import runner
from pipeline.evaluation.model_selection import stratified_folds
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("ray_session")

GOOD_BOOK = "The ship sailed over quiet grey water at dawn.\n\nOld men watched it from the harbour walls.\n"


def prepare(corpus: Path, out: Path, **kwargs) -> dict:
    return prepare_corpus(corpus, out, num_workers=2, shard_bytes=1 << 20, **kwargs)


def corpus_with(tmp_path: Path, name: str, content: bytes) -> Path:
    """A good book plus one file with `content`, so a run has something to keep."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "good.txt").write_text(GOOD_BOOK)
    (corpus / name).write_bytes(content)
    return corpus


def entry(manifest: dict, book_id: str) -> dict:
    return next(file for file in manifest["files"] if file["book_id"] == book_id)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist or is not a directory; pass the folder"):
        prepare(tmp_path / "nope", tmp_path / "out")


def test_empty_directory(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(ValueError, match="no files under .* match data.glob='\\*\\*/\\*.txt'; check the directory"):
        prepare(tmp_path / "corpus", tmp_path / "out")


@pytest.mark.parametrize("content, reason", [
    (b"", "empty file"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 100, "binary file (contains NUL bytes: 20% of characters)"),
    (bytes(range(1, 9)) * 500, "binary file (100% of characters are control codes)"),
])
def test_empty_and_binary_files_are_rejected_with_a_reason(tmp_path, content, reason):
    manifest = prepare(corpus_with(tmp_path, "bad.txt", content), tmp_path / "out")
    assert entry(manifest, "bad.txt")["status"] == "rejected"
    assert entry(manifest, "bad.txt")["reason"] == reason
    assert entry(manifest, "good.txt")["status"] == "kept"


def test_invalid_utf8_is_replaced_and_counted_not_turned_into_mojibake(tmp_path):
    raw = "\u201cIt\u2019s a caf\u00e9,\u201d she said to the old man.\n".encode() + b"A bad \xff\xfe byte pair here.\n"
    manifest = prepare(corpus_with(tmp_path, "broken.txt", raw), tmp_path / "out")
    broken = entry(manifest, "broken.txt")
    assert (broken["status"], broken["encoding"], broken["invalid_utf8_sequences_replaced"]) == ("kept", "utf-8", 2)
    texts = [text for file in (tmp_path / "out").glob("shard-*.arrow") for text in _texts(file)]
    assert "\u201cIt\u2019s a caf\u00e9,\u201d she said to the old man." in texts
    assert "A bad \ufffd\ufffd byte pair here." in texts


def test_utf16_books_are_decoded_and_stray_nuls_removed_and_counted(tmp_path):
    tale = "The lighthouse keeper climbed the stairs each night.\n\nHis lamp guided the fishing boats home.\n"
    corpus = corpus_with(tmp_path, "le.txt", codecs.BOM_UTF16_LE + tale.encode("utf-16-le"))
    (corpus / "be.txt").write_bytes(codecs.BOM_UTF16_BE + tale.encode("utf-16-be"))
    diary = "".join(f"On day {day} the baker sold fresh bread to the village.\n" for day in range(10))
    (corpus / "nuls.txt").write_bytes(diary.replace("baker", "baker\x00", 3).encode())  # 3 NULs in ~570 bytes
    manifest = prepare(corpus, tmp_path / "out")
    le, be, nuls = (entry(manifest, name) for name in ("le.txt", "be.txt", "nuls.txt"))
    assert (be["status"], be["encoding"]) == ("kept", "utf-16-be")
    # Its exact duplicate: the same text once decoded.
    assert (le["status"], le["encoding"], le["duplicate_of"]) == ("duplicate", "utf-16-le", "be.txt")
    assert (nuls["status"], nuls["nul_characters_removed"]) == ("kept", 3)
    assert manifest["totals"]["nul_characters_removed"] == 3
    texts = [text for file in (tmp_path / "out").glob("shard-*.arrow") for text in _texts(file)]
    assert "His lamp guided the fishing boats home." in texts
    assert "On day 0 the baker sold fresh bread to the village." in texts and not any("\x00" in t for t in texts)


def _texts(shard: Path) -> list[str]:
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(shard))).read_all().column("text").to_pylist()


FIFTY_MB = 50_000_000
# 100-word sentences: a whole book on one line, as some broken conversions produce.
LONG_LINE_SENTENCE = ("The long line goes on and on " * 14 + "until it finally ends here. ").encode()


def write_long_line(path: Path) -> int:
    repeats = FIFTY_MB // len(LONG_LINE_SENTENCE)
    path.write_bytes(LONG_LINE_SENTENCE * repeats)
    return repeats


def test_a_50_mb_single_line_is_read_in_parts_and_split_into_sentences(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    repeats = write_long_line(corpus / "one_line.txt")
    manifest = prepare(corpus, tmp_path / "out", near_duplicates=None)
    # in parts of about MAX_BOOK_BYTES, cut after a sentence's ". ": no sentence is cut in two
    parts = math.ceil((corpus / "one_line.txt").stat().st_size / MAX_BOOK_BYTES)
    assert [e["book_id"] for e in manifest["files"]] == [f"one_line.txt#{i}/{parts}" for i in range(1, parts + 1)]
    assert all(e["status"] == "kept" for e in manifest["files"])
    assert sum(e["sentences"] for e in manifest["files"]) == repeats


def _parts(manifest: dict, name: str) -> list[dict]:
    return [e for e in manifest["files"] if e["book_id"].startswith(f"{name}#")]


def test_a_line_longer_than_a_book_is_cut_at_sentence_ends_into_books_of_bounded_size(tmp_path):
    line = b"".join(b"Sentence %d of the line goes on and on until it ends here. " % i for i in range(2_000))
    corpus = corpus_with(tmp_path, "one_line.txt", line)  # 120 kB, no line break
    manifest = prepare(corpus, tmp_path / "out", near_duplicates=None, max_book_bytes=10_000)
    parts = _parts(manifest, "one_line.txt")
    assert len(parts) == math.ceil(len(line) / 10_000) and all(p["status"] == "kept" for p in parts)
    assert sum(p["sentences"] for p in parts) == 2_000 and sum(p["bytes"] for p in parts) == len(line)
    assert max(p["bytes"] for p in parts) < 10_000 + 64
    prepare(corpus, tmp_path / "whole", near_duplicates=None)
    assert open_shards(tmp_path / "out").column("text") == open_shards(tmp_path / "whole").column("text")


def test_text_without_spaces_is_cut_between_characters(tmp_path):
    # 2-byte characters, each starting at an odd offset: the nominal cuts at multiples of 10,000 fall inside them
    data = b"x" + "\u00e9".encode() * 30_000
    corpus = corpus_with(tmp_path, "garbage.txt", data)
    pieces, _ = plan_pieces(corpus, ["garbage.txt"], [len(data)], max_book_bytes=10_000)
    assert [(p.start, p.end) for p in pieces] == [(0, 10_001), (10_001, 20_001), (20_001, 30_001), (30_001, 40_001),
                                                   (40_001, 50_001), (50_001, 60_001)]
    for piece in pieces:
        data[piece.start:piece.end].decode("utf-8")  # strict: a cut inside a character would raise


def test_utf16_text_too_big_for_a_book_is_rejected_unread_with_what_to_do(tmp_path):
    corpus = corpus_with(tmp_path, "wide.txt", codecs.BOM_UTF16_LE + (GOOD_BOOK * 100).encode("utf-16-le"))
    manifest = prepare(corpus, tmp_path / "out", max_book_bytes=10_000)
    wide = entry(manifest, "wide.txt")
    assert wide["status"] == "rejected" and "save it as UTF-8" in wide["reason"]
    assert entry(manifest, "good.txt")["status"] == "kept"


def test_a_hundred_thousand_tiny_files_are_read_in_groups_not_one_task_each(tmp_path, monkeypatch):
    """At reduced size (2,000 files; the real 100,000 took 90 s and 1.7 GB peak RSS, driver and Ray workers, on the
    2-core machine): every file is accounted for, in a few Ray tasks of at most 1,000 books each."""
    corpus = tmp_path / "corpus"
    for i in range(2_000):
        shelf = corpus / f"{i // 500:03d}"
        shelf.mkdir(parents=True, exist_ok=True)
        (shelf / f"note-{i:05d}.txt").write_text(f"Note {i} was written on the ship at night, and it was short.\n")
    groups = []
    group_by_bytes = prepare_module.group_by_bytes

    def recorded(*args):
        groups.extend(group_by_bytes(*args))
        return groups

    monkeypatch.setattr(prepare_module, "group_by_bytes", recorded)
    manifest = prepare(corpus, tmp_path / "out", near_duplicates=None)
    assert manifest["totals"]["files_read"] == manifest["totals"]["files_kept"] == 2_000
    assert [len(group) for group in groups] == [1_000, 1_000]  # 130 kB: one group by size, cut at 1,000 books


def test_a_50_mb_single_line_costs_memory_proportional_to_its_size(tmp_path):
    """Peak RSS of a fresh process that processes the line: the old per-word `str.split()` collapse alone
    took ~0.5 GB for the line's word list."""
    write_long_line(tmp_path / "one_line.txt")
    script = textwrap.dedent(f"""
        import resource
        from data_prep.corpus.ingest import IngestOptions, process_book
        raw = open({str(tmp_path / "one_line.txt")!r}, "rb").read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = process_book("one_line.txt", raw, IngestOptions())
        print(result.status, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).parents[2]).stdout.split()
    status, growth = out[0], int(out[1])
    assert status == "kept"
    # Measured: ~1.3 GB, the same as for the same text with a line break after every sentence (the copies
    # process_book makes of any 50 MB book); a per-word list of the whole line would add ~0.5 GB on top.
    assert growth < 30 * FIFTY_MB, f"peak RSS grew by {growth / 1e6:.0f} MB for a 50 MB line"


def test_broken_symlink_and_fifo_are_rejected_not_skipped_or_blocking(tmp_path):
    # Tests run as root, so chmod 000 would not stop a read: a dangling symlink and a named pipe are the
    # unreadable "files" used here. Reading the FIFO would block forever without a writer, /dev/zero never ends.
    corpus = corpus_with(tmp_path, "placeholder.txt", GOOD_BOOK.replace("ship", "boat").encode())
    (corpus / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    os.mkfifo(corpus / "pipe.txt")
    (corpus / "zeros.txt").symlink_to("/dev/zero")
    manifest = prepare(corpus, tmp_path / "out")
    assert entry(manifest, "dangling.txt")["status"] == "rejected"
    assert entry(manifest, "dangling.txt")["reason"].startswith("unreadable (FileNotFoundError")
    assert entry(manifest, "pipe.txt")["reason"] == (
        "not a regular file (a named pipe (FIFO)): skipped unread; only regular files, or links to them, are read "
        "as books")
    assert entry(manifest, "zeros.txt")["reason"].startswith("not a regular file (a device): skipped unread")
    assert manifest["totals"]["files_read"] == 5


@pytest.mark.parametrize("option, message", [
    (dict(glob="**/*.epub"), "match data.glob='**/*.epub'; check the directory (data.corpus_dir), or set data.glob"),
    (dict(input_format="xml"), "data.input_format='xml' is not supported"),
    (dict(min_tokens=10, max_tokens=5), "got data.min_tokens=10, data.max_tokens=5"),
    (dict(shard_bytes=0), "data.shard_bytes must be positive"),
    (dict(num_workers=0), "num_workers (ray.num_cpus in the pipeline) must be at least 1"),
])
def test_messages_name_the_full_config_key(tmp_path, option, message):
    corpus = corpus_with(tmp_path, "other.txt", GOOD_BOOK.encode())
    with pytest.raises(ValueError) as err:
        prepare_corpus(corpus, tmp_path / "out", **{"num_workers": 2, "shard_bytes": 1 << 20, **option})
    assert message in str(err.value)


def test_vocabulary_and_near_duplicate_messages_name_the_full_config_key():
    with pytest.raises(ValueError, match="data.near_duplicate_threshold must be in"):
        NearDuplicateOptions(threshold=0)
    with pytest.raises(ValueError, match="elmo.vocab_size=3 leaves no room"):
        elmo_examples.build_word_vocab(["a b"], max_size=3, min_count=1)
    with pytest.raises(ValueError, match="skip_thought.vocab_size=3 leaves no room"):
        skip_thought_examples.build_word_vocab({"a": 1}, vocab_size=3)
    with pytest.raises(ValueError, match="lower senteval.classifier.cv_folds or senteval.classifier.inner_folds"):
        stratified_folds(np.array([0, 1]), 5, np.random.default_rng(0))


def test_a_book_whose_file_name_is_not_utf8_is_prepared_under_its_escaped_name(tmp_path):
    """A book named caf\\xe9.txt (Latin-1) failed prepare: its name, the book_id, is a column
    of the shards, which hold UTF-8 only."""
    corpus = corpus_with(tmp_path, os.fsdecode(b"caf\xe9.txt"),
                         b"A farmer ploughed the long field before the rain came.\n")
    manifest = prepare(corpus, tmp_path / "out")
    assert {file["book_id"]: file["status"] for file in manifest["files"]} == {"caf\\xe9.txt": "kept",
                                                                              "good.txt": "kept"}
    assert "caf\\xe9.txt" in open_shards(tmp_path / "out").column("book_id").to_pylist()


def test_books_behind_a_linked_folder_and_in_upper_case_are_prepared(tmp_path):
    corpus = corpus_with(tmp_path, "BOOK.TXT", b"A farmer ploughed the long field before the rain came.\n")
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (shelf / "linked.txt").write_text("The children ran laughing down the hill to the river.\n")
    (corpus / "shelf").symlink_to(shelf, target_is_directory=True)
    (shelf / "back").symlink_to(corpus, target_is_directory=True)  # a loop: corpus/shelf/back/shelf/back/...
    manifest = prepare(corpus, tmp_path / "out")
    assert {file["book_id"]: file["status"] for file in manifest["files"]} == {
        "BOOK.TXT": "kept", "good.txt": "kept", "shelf/linked.txt": "kept"}


def test_the_driver_lists_rejected_files_by_reason_and_the_manifest(tmp_path, monkeypatch, capsys):
    corpus = corpus_with(tmp_path, "dangling.txt", b"")
    (corpus / "dangling.txt").unlink()
    (corpus / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    for n in range(4):
        (corpus / f"image{n}.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * (n + 1))
    prepared = tmp_path / "prepared"
    prepare(corpus, prepared)

    def run_dag(cfg, stages, run_dir):  # what the DAG leaves behind: the run directory links each stage's output
        run_dir.mkdir(parents=True)
        (run_dir / "prepare").symlink_to(prepared, target_is_directory=True)
        return {"prepare": {"state": "ran"}}

    monkeypatch.setattr(runner, "run_dag", run_dag)
    monkeypatch.setattr(runner, "init_ray", lambda cfg: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # the session's Ray serves the other tests
    monkeypatch.setenv("WANDB_MODE", "offline")
    capsys.readouterr()
    runner.run_pipeline(tiny_config(tmp_path))
    assert capsys.readouterr().out.splitlines()[-5:-1] == [
        f"prepare: 1 of 6 files kept, 0 duplicates, 0 near duplicates, 5 rejected; every file's fate and reason: "
        f"{prepared / 'manifest.json'}",
        "  sentences: 2 kept, 0 dropped as shorter than data.min_tokens=3 tokens, 0 as longer than "
        "data.max_tokens=200",
        "  rejected, binary file (4): image0.txt, image1.txt, image2.txt and 1 more",
        "  rejected, unreadable (1): dangling.txt"]


def test_sentences_dropped_by_each_length_filter_are_counted_and_said_with_why(tmp_path):
    """Issue 39, defect 9: words joined by zero-width spaces were dropped 'by length', as tokens are counted as spaces
    + 1, and only a total said so; each filter's count, and why, is in the manifest and the summary the driver prints.
    Issue 41: Chinese, written without spaces, is counted a token per character (BERT-Chinese), so it is filtered by
    its length like any other text, not dropped whole as one token a sentence."""
    corpus = corpus_with(tmp_path, "chinese.txt", "好。她走进了花园。我们明天再见吧，然后一起去看电影。\n".encode())
    (corpus / "joined.txt").write_text("The\u200bold\u200bman\u200bsaw\u200bthe\u200bship. "
                                       "He waved to us from the quiet harbour wall at dawn.\n")
    manifest = prepare(corpus, tmp_path / "out", min_tokens=3, max_tokens=9)
    chinese = entry(manifest, "chinese.txt")  # 好。 is 2 tokens, 她走进了花园。 7, the last 17
    assert (chinese["status"], chinese["sentences"], chinese["sentences_dropped_too_short"],
            chinese["sentences_dropped_too_long"]) == ("kept", 1, 1, 1)
    joined = entry(manifest, "joined.txt")
    assert (joined["sentences_dropped_too_short"], joined["sentences_dropped_too_long"]) == (1, 1)
    totals = manifest["totals"]
    assert (totals["sentences_dropped_too_short"], totals["sentences_dropped_too_long"]) == (2, 2)
    assert manifest_summary(tmp_path / "out").splitlines()[1] == (
        f"  sentences: {totals['sentences']} kept, 2 dropped as shorter than data.min_tokens=3 tokens, 2 as longer "
        "than data.max_tokens=9 (tokens are counted as space-separated runs, each CJK character one: text joined by "
        "zero-width spaces is one token a sentence)")


def test_corpus_filtered_to_zero_sentences(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "short.txt").write_text("Too short.\n\nAlso short.\n")
    (corpus / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="no sentences left from 2 files .*widen data.min_tokens"):
        prepare(corpus, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())
