import json
import random
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import ray

import data_prep.corpus.prepare
import data_prep.corpus.shards
from data_prep.corpus.ingest import IngestOptions, process_book
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.sentences import default_splitter
from data_prep.corpus.shards import MANIFEST_NAME, ShardPlan, ShardPlanner, file_sha256, iter_books, open_shards

WORDS = "the a ship sailed over quiet grey water while old men watched from harbour walls and sang".split()
SHARD_BYTES = 4096


@pytest.fixture(scope="module", autouse=True)
def ray_for_module():
    # One Ray instance for the module: ray.init costs seconds. Auth off as in the Makefile. A Ray session
    # another module left running is used as it is, and left running.
    if ray.is_initialized():
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield
        ray.shutdown()


def make_prose(seed: int, paragraphs: int) -> str:
    """Hard-wrapped paragraphs of 5-12 word sentences, different for every seed."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(paragraphs):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
                     for _ in range(rng.randint(2, 5))]
        blocks.append(textwrap.fill(" ".join(sentences), width=60))
    return "\n\n".join(blocks) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "shelf").mkdir()
    (root / "a.txt").write_text(make_prose(1, 8))
    # The same text as a.txt with a BOM and CRLF line endings: an exact duplicate.
    (root / "shelf" / "a_copy.txt").write_bytes(b"\xef\xbb\xbf" + make_prose(1, 8).replace("\n", "\r\n").encode())
    (root / "b.txt").write_text(
        "Title: Book B\nAuthor: Someone\n\n*** START OF THE PROJECT GUTENBERG EBOOK B ***\n\n"
        + make_prose(2, 10) + "\n*** END OF THE PROJECT GUTENBERG EBOOK B ***\nLicence.\n")
    (root / "big.txt").write_text(make_prose(3, 120))  # larger than one shard
    (root / "c.txt").write_bytes(("\u201cQuoted\u201d " + make_prose(4, 6)).encode("cp1252"))
    (root / "empty.txt").write_bytes(b"")
    (root / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "shelf" / "d.txt").write_text(make_prose(5, 5))
    (root / "notes.md").write_text(make_prose(6, 2))  # does not match the glob
    return root


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("shards")
    return out_dir, prepare_corpus(corpus, out_dir, shard_bytes=SHARD_BYTES, num_workers=2)


def test_manifest_accounts_for_every_file(corpus, prepared):
    _, manifest = prepared
    files = {entry["book_id"]: entry for entry in manifest["files"]}
    assert list(files) == ["a.txt", "b.txt", "big.txt", "c.txt", "empty.txt", "image.txt",
                           "shelf/a_copy.txt", "shelf/d.txt"]
    assert {book_id: entry["status"] for book_id, entry in files.items()} == {
        "a.txt": "kept", "b.txt": "kept", "big.txt": "kept", "c.txt": "kept", "shelf/d.txt": "kept",
        "empty.txt": "rejected", "image.txt": "rejected", "shelf/a_copy.txt": "duplicate"}
    assert files["shelf/a_copy.txt"]["duplicate_of"] == "a.txt"
    assert files["empty.txt"]["reason"] == "empty file"
    assert files["image.txt"]["reason"].startswith("binary file")
    assert (files["c.txt"]["encoding"], files["shelf/a_copy.txt"]["encoding"]) == ("cp1252", "utf-8-sig")
    assert (files["b.txt"]["title"], files["b.txt"]["author"]) == ("Book B", "Someone")
    for book_id, entry in files.items():
        assert entry["bytes"] == (corpus / book_id).stat().st_size
    totals = manifest["totals"]
    counts = [totals[f"files_{status}"] for status in ("read", "kept", "duplicate", "near_duplicate", "rejected")]
    assert counts == [8, 5, 1, 0, 2]
    assert totals["sentences"] == sum(entry["sentences"] for entry in files.values()) == sum(
        shard["rows"] for shard in manifest["shards"])
    assert manifest["options"] == {"glob": "**/*.txt", "shard_bytes": SHARD_BYTES, "max_book_bytes": 16 << 20,
                                   "input_format": "raw",
                                   "min_tokens": 3, "max_tokens": 200, "nfkc": False,
                                   "sentence_splitter": default_splitter(), "chinese_variant": "keep",
                                   "near_duplicates": {"threshold": 0.8, "shingle_words": 5, "num_perm": 128,
                                                       "seed": 0}}
    assert json.loads((prepared[0] / MANIFEST_NAME).read_text()) == manifest


def test_shards_hold_the_kept_books_in_order(corpus, prepared):
    out_dir, manifest = prepared
    assert len(manifest["shards"]) >= 2
    assert sorted(path.name for path in out_dir.iterdir()) == sorted(
        [MANIFEST_NAME] + [shard["file"] for shard in manifest["shards"]])  # no *.tmp left behind
    for shard in manifest["shards"]:
        assert file_sha256(out_dir / shard["file"]) == shard["sha256"]
        assert (out_dir / shard["file"]).stat().st_size == shard["bytes"]

    kept = [entry["book_id"] for entry in manifest["files"] if entry["status"] == "kept"]
    expected = [(book_id, paragraph, sentence, text) for book_id in kept
                for paragraph, sentence, text in process_book(book_id, (corpus / book_id).read_bytes(),
                                                              IngestOptions()).sentences]
    table = open_shards(out_dir)
    columns = ("book_id", "paragraph_index", "sentence_index", "text")
    assert list(zip(*(table[name].to_pylist() for name in columns))) == expected

    books = list(iter_books(out_dir))
    assert [book.book_id for book in books] == kept
    big = books[kept.index("big.txt")]
    assert big.title == "big"
    assert big.paragraphs == [
        [text for book_id, p, _, text in expected if book_id == "big.txt" and p == paragraph]
        for paragraph in range(120)]


def test_only_a_book_bigger_than_a_shard_spans_shards(prepared):
    _, manifest = prepared
    spans = {}
    for index, shard in enumerate(manifest["shards"]):
        for book_id in {shard["first_book"], shard["last_book"]}:
            spans.setdefault(book_id, []).append(index)
    assert all(len(indices) == 1 for book_id, indices in spans.items() if book_id != "big.txt")
    big = spans["big.txt"]
    assert len(big) >= 2 and big == list(range(big[0], big[-1] + 1))


def test_output_does_not_depend_on_worker_count(corpus, prepared, tmp_path):
    _, manifest = prepared
    # A previous run's leftovers must not survive into the new output.
    (tmp_path / "shard-00099.arrow").write_bytes(b"stale")
    (tmp_path / "shard-00000.arrow.tmp").write_bytes(b"half")
    single = prepare_corpus(corpus, tmp_path, shard_bytes=SHARD_BYTES, num_workers=1)
    assert single["shards"] == manifest["shards"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [MANIFEST_NAME] + [shard["file"] for shard in manifest["shards"]])


def test_the_planner_closes_a_shard_before_a_book_that_does_not_fit_and_splits_only_a_bigger_one():
    planner = ShardPlanner(100)
    closed = []
    for book, sizes in [("A", [30, 30]), ("B", [50]), ("C", [40, 40, 40, 40]), ("D", []), ("E", [150])]:
        closed += planner.add_book(book, np.array(sizes, dtype=np.int64))
    closed += planner.finish()
    assert closed == [ShardPlan(0, (("A", 0, 2),)), ShardPlan(1, (("B", 0, 1),)), ShardPlan(2, (("C", 0, 2),)),
                      ShardPlan(3, (("C", 2, 4),)), ShardPlan(4, (("E", 0, 1),))]  # E: one row above a shard
    assert ShardPlanner(100).finish() == []
    with pytest.raises(ValueError, match="shard_bytes must be positive"):
        ShardPlanner(0)


def _holds_rows(value) -> bool:
    if isinstance(value, (pa.RecordBatch, pa.Table)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_rows(item) for item in value)
    return False


def test_the_driver_writes_no_shard_and_never_fetches_a_books_rows(corpus, prepared, tmp_path, monkeypatch):
    """Ray tasks write the shards from the rows where the groups' tasks left them and the driver only plans them, so
    no one process carries the corpus's bytes: writing them all in the driver capped prepare at ~25 workers
    (docs/scaling.md). Same shards as ever."""
    fetched = []
    get = ray.get

    def recording_get(refs, *args, **kwargs):
        values = get(refs, *args, **kwargs)
        fetched.append(values)
        return values

    def no_writing_here(*args, **kwargs):
        raise AssertionError("the driver wrote a shard")

    monkeypatch.setattr(ray, "get", recording_get)
    # the driver's modules only: a Ray worker imports its own
    monkeypatch.setattr(data_prep.corpus.shards, "write_shard", no_writing_here)
    monkeypatch.setattr(data_prep.corpus.prepare, "write_shard", no_writing_here)
    manifest = prepare_corpus(corpus, tmp_path, shard_bytes=SHARD_BYTES, num_workers=2)
    assert manifest["shards"] == prepared[1]["shards"]
    assert fetched and not any(_holds_rows(values) for values in fetched)


def test_progress_lines_while_preparing(corpus, tmp_path, capsys):
    prepare_corpus(corpus, tmp_path, shard_bytes=SHARD_BYTES, num_workers=2, progress_interval_s=0)
    lines = capsys.readouterr().out.splitlines()
    progress = [line for line in lines if line.startswith("prepare: ") and "ETA" in line]
    assert len(progress) == 8  # one per file with a zero interval
    assert progress[-1].startswith("prepare: 8/8 files, ") and progress[-1].endswith("ETA 0 s")
    assert any(line.startswith("prepare: done, 8 files, ") and "1 duplicates, 0 near duplicates, 2 rejected" in line
               for line in lines)


def test_off_x86_64_the_driver_announces_nupunkt_once_and_every_worker_splits_with_it(tmp_path, monkeypatch, capsys):
    from data_prep.corpus import sentences
    from tests.data_prep.test_sentences import BOOK, SPLIT

    # Only the driver is patched: the workers split as the options it sends them say.
    monkeypatch.setattr(sentences, "blingfire_unavailable", lambda: "blingfire ships x86-64 binaries only")
    corpus = tmp_path / "books"
    corpus.mkdir()
    (corpus / "one.txt").write_text(BOOK)
    (corpus / "two.txt").write_text(make_prose(7, 3))
    manifest = prepare_corpus(corpus, tmp_path / "out", min_tokens=1, near_duplicates=None, num_workers=2)
    assert manifest["options"]["sentence_splitter"] == "nupunkt"
    notices = [line for line in capsys.readouterr().out.splitlines() if line.startswith("NOTICE:")]
    assert notices == [sentences.fallback_notice()]
    book = next(book for book in iter_books(tmp_path / "out") if book.book_id == "one.txt")
    assert [sentence for paragraph in book.paragraphs for sentence in paragraph] == SPLIT


def test_open_shards_refuses_an_unfinished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run data_prep.corpus.prepare.prepare_corpus again"):
        open_shards(tmp_path)


TRICKY_TEXTS = ["  Caf\u00e9 na\u00efve \u4e2d\u6587 x\x0by a\x85b \u2028 z  ", "",
                "w" * 150 + " \u201cHi,\u201d she said\u2026",
                "\u0301b \t tab", "UPPER lower, Mixed.", "a[SEP]b [MASK] [sep] x[CLS]",
                # what the pre-split cuts off (ASCII symbols, Unicode P*) next to what it must not: symbols BERT keeps
                # inside words (\u00a9 \u00b1), a combining mark after punctuation, the Greek question mark (NFD: ";"),
                # non-ASCII capitals, which the ASCII lowering leaves to the tokenizer
                "U.S.A. $5+3=8 <a|b> ^~` 50% (e.g.) \u00abBonjour\u00bb \u00bfqu\u00e9? don't .\u0301x a\u037eb",
                "\u00c9COLE Stra\u00dfe a\u00a9b 1\u00b12 \u0130stanbul \u2014dash\u2014 "
                "\u2018quote\u2019 \u00a0nbsp\u3002end"]


def test_tokenized_shards_equal_encoding_each_sentence(prepared, tmp_path):
    import pyarrow as pa

    from data_prep.corpus.tokenize_shards import encode_by_word, tokenize_shard
    from data_prep.corpus.tokenizer import TOKENIZER_FILE, encode_batch_ids, train_wordpiece

    out_dir, manifest = prepared
    texts = open_shards(out_dir).column("text").to_pylist()
    tokenizer = train_wordpiece(texts + TRICKY_TEXTS, tmp_path / "tok", vocab_size=200, min_frequency=1)
    assert encode_by_word(tokenizer, pa.array(TRICKY_TEXTS)).to_pylist() == encode_batch_ids(tokenizer, TRICKY_TEXTS)
    cased = train_wordpiece(texts + TRICKY_TEXTS, tmp_path / "cased", vocab_size=300, min_frequency=1, lowercase=False)
    assert encode_by_word(cased, pa.array(TRICKY_TEXTS)).to_pylist() == encode_batch_ids(cased, TRICKY_TEXTS)

    shard = out_dir / manifest["shards"][0]["file"]
    tokens = tokenize_shard(shard, tmp_path / "tok" / TOKENIZER_FILE, tmp_path / "ids.arrow")
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "ids.arrow"))).read_all()
    expected = encode_batch_ids(tokenizer, pa.ipc.open_file(str(shard)).read_all().column("text").to_pylist())
    assert table.column("input_ids").to_pylist() == expected
    assert tokens == sum(map(len, expected)) > 0


def test_near_duplicate_index_holds_no_view_into_task_results(corpus, tmp_path, monkeypatch):
    """Ray deserialises a numpy array as a view into the task's result in the object store: an index that
    kept such views would pin every group's sentences there until the run ends, so that memory grew with
    the corpus (measured: 1.30x peak RSS at 4x the corpus before, 1.03x after)."""
    from data_prep.corpus.dedup import NearDuplicateIndex

    owns_memory = []
    add = NearDuplicateIndex.add

    def recording_add(index, book_id, signature):
        owns_memory.append(signature.base is None)
        add(index, book_id, signature)

    monkeypatch.setattr(NearDuplicateIndex, "add", recording_add)
    prepare_corpus(corpus, tmp_path / "out", shard_bytes=SHARD_BYTES, num_workers=2)
    assert owns_memory and all(owns_memory)


def test_a_workers_word_cache_serves_each_tokenizer_its_own_ids(tmp_path, monkeypatch):
    """A Ray worker keeps the ids of words it has encoded for the next shard: switching tokenizers must not reuse
    them, and a full cache must still encode new words."""
    import pyarrow as pa

    from data_prep.corpus import tokenize_shards
    from data_prep.corpus.tokenize_shards import encode_by_word
    from data_prep.corpus.tokenizer import encode_batch_ids, train_wordpiece

    texts = [" ".join(WORDS[i:] + WORDS[:i]) + "." for i in range(len(WORDS))] + TRICKY_TEXTS
    small = train_wordpiece(texts, tmp_path / "small", vocab_size=110, min_frequency=1)
    large = train_wordpiece(texts, tmp_path / "large", vocab_size=300, min_frequency=1)
    assert encode_batch_ids(small, texts) != encode_batch_ids(large, texts)
    for tokenizer in (small, large, small):
        assert encode_by_word(tokenizer, pa.array(texts)).to_pylist() == encode_batch_ids(tokenizer, texts)
    monkeypatch.setattr(tokenize_shards, "_encoded_words", None)
    monkeypatch.setattr(tokenize_shards, "_CACHED_WORDS_MAX", 5)
    more = texts + ["harbour walls, unseen words: zephyr quixotic"]
    assert encode_by_word(small, pa.array(more)).to_pylist() == encode_batch_ids(small, more)
    assert len(tokenize_shards._encoded_words.ids) <= 5
