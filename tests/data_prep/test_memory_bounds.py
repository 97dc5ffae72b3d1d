"""Each data stage's memory stays bounded when the corpus grows: a tiny corpus and the same made 4x larger, asserting
on the structures a stage allocates (not on time or RSS): what prepare keeps per book, the tokenizer's sample, the
pretraining instance index and the held-out sets.

Per-book state (a MinHash signature and band keys, a manifest entry, an exact-duplicate key) grows with the number of
books, ~4.6 KB each (BookCorpus's 11,038 books: ~50 MB), and not with their length, which is what these tests check."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import data_prep.corpus.prepare as prepare_module
from data_prep.corpus.dedup import NearDuplicateIndex, NearDuplicateOptions
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.shards import open_shards, sampled_texts, shard_paths
from data_prep.examples.skip_thought_examples import TRIPLE_SCHEMA, write_triples
from pipeline.bert.data import PretrainingInstances
from pipeline.elmo.data import build_elmo_datasets
from pipeline.engine.arrow import read_arrow
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.skip_thought.module import collate_triples
from tests.helpers import TinyRun, tiny_config, write_books

NUM_BOOKS, PARAGRAPHS = 6, 12


def _prepare_with_index(corpus, out, monkeypatch) -> tuple[dict, NearDuplicateIndex]:
    indexes = []

    class RecordedIndex(NearDuplicateIndex):
        def __init__(self, options):
            super().__init__(options)
            indexes.append(self)

    monkeypatch.setattr(prepare_module, "NearDuplicateIndex", RecordedIndex)
    manifest = prepare_corpus(corpus, out, shard_bytes=4000, num_workers=2, near_duplicates=NearDuplicateOptions())
    return manifest, indexes[0]


def _index_entries(index: NearDuplicateIndex) -> tuple[int, int, int]:
    """(signatures, bytes of signatures, band-table entries)."""
    signatures = index._signatures
    entries = sum(len(ids) for bucket in index._buckets for ids in bucket.values())
    return len(signatures), sum(s.nbytes for s in signatures), entries


def test_what_prepare_keeps_per_book_does_not_grow_with_the_books(tmp_path, ray_session, monkeypatch):
    short = write_books(tmp_path / "short", NUM_BOOKS, PARAGRAPHS)
    long = write_books(tmp_path / "long", NUM_BOOKS, 4 * PARAGRAPHS)
    small, small_index = _prepare_with_index(short, tmp_path / "small", monkeypatch)
    large, large_index = _prepare_with_index(long, tmp_path / "large", monkeypatch)
    assert large["totals"]["input_bytes"] > 3.5 * small["totals"]["input_bytes"]
    # the MinHash index: one fixed-size signature per kept book, one band-table entry per band
    assert _index_entries(small_index) == _index_entries(large_index) == (
        NUM_BOOKS, NUM_BOOKS * 128 * 8, NUM_BOOKS * small_index.bands)
    # the manifest: one entry per file, whatever its length (and one per shard written: ~200 bytes per shard_bytes)
    small_files, large_files = (json.dumps(m["files"]) for m in (small, large))
    assert len(large["files"]) == len(small["files"]) == NUM_BOOKS and len(large_files) < 1.1 * len(small_files)


def test_a_sample_of_sentences_is_capped_evenly_spread_and_the_same_each_time(tmp_path, ray_session):
    corpus = write_books(tmp_path / "books", 4 * NUM_BOOKS, PARAGRAPHS)
    prepare_corpus(corpus, tmp_path / "shards", shard_bytes=4000, num_workers=2, near_duplicates=None)
    table = open_shards(tmp_path / "shards")
    everything = table.column("text").to_pylist()
    assert sampled_texts(tmp_path / "shards", None)[0] == len(everything)
    assert list(sampled_texts(tmp_path / "shards", 10**9)[1]) == everything
    k, sample = sampled_texts(tmp_path / "shards", 50)
    sample = list(sample)
    assert k == len(sample) == 50 and sample == list(sampled_texts(tmp_path / "shards", 50)[1])
    # every n/k-th sentence: each book gives its share, as in a uniform sample
    books = table.column("book_id").to_pylist()
    taken = [books[i] for i in np.flatnonzero([t in set(sample) for t in everything])]
    assert set(taken) == set(books)
    # Read one shard memory-mapped at a time: a map's pages stay in RSS until it is closed, so mapping them all grew
    # the tokenizer stage with the corpus (1.5 GB at 1 GB of books).
    shards = {str(path) for path in shard_paths(tmp_path / "shards")}
    assert len(shards) >= 4
    del table  # open_shards' table maps every shard

    def mapped_shards() -> int:
        return len({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()} & shards)

    mapped = [mapped_shards() for _ in sampled_texts(tmp_path / "shards", None)[1]]
    assert max(mapped) == 1 and mapped_shards() == 0


@pytest.mark.parametrize("scale", [1, 4])
def test_the_tokenizer_trains_on_at_most_max_sentences(tmp_path, ray_session, scale):
    write_books(tmp_path / "books", scale * NUM_BOOKS, PARAGRAPHS)
    run = TinyRun(tiny_config(tmp_path, ["tokenizer.max_sentences=200", "pipeline.until=bert_tokenizer"]))
    sentences = run.run_stage("prepare")["sentences"]
    assert sentences > 250 and (scale == 1 or sentences > 1000)
    assert run.run_stage("bert_tokenizer")["sentences"] == 200


def test_the_pretraining_instance_index_is_the_memory_mapped_examples(tmp_path, ray_session):
    """Only the instances' offsets are per instance; both they and the token ids stay in the memory-mapped files."""
    write_books(tmp_path / "books", 4 * NUM_BOOKS, PARAGRAPHS)
    run = TinyRun(tiny_config(tmp_path, ["pipeline.until=bert_examples"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples"):
        run.run_stage(stage)
    dataset = PretrainingInstances([read_arrow(f) for f in sorted(run.stage_dir("bert_examples").glob("*.arrow"))])
    assert len(dataset) > 100
    assert not any(array.flags.owndata for array in dataset.arrays())


@pytest.mark.parametrize("scale", [1, 4])
def test_skip_thought_holds_out_at_most_val_max_triples(tmp_path, scale):
    n = 400 * scale
    write_triples([([i], [i + 1], [i + 2]) for i in range(n)], tmp_path / "t.arrow")
    triples = ArrowRows([read_arrow(tmp_path / "t.arrow")], TRIPLE_SCHEMA.names)
    train, val = pretraining_loaders(triples, collate_triples, batch_size=4, val_fraction=0.1, val_max=50, seed=0)
    assert len(val.dataset) == (40 if scale == 1 else 50)
    assert train.sampler.sampler.num_samples == n - len(val.dataset)


@pytest.mark.parametrize("scale", [1, 4])
def test_elmo_holds_out_at_most_holdout_max_books(tmp_path, scale):
    from data_prep.examples.elmo_examples import write_token_streams

    books = [(f"book-{i}", ["the", "ship", "sailed"] * 5) for i in range(20 * scale)]
    write_token_streams(books, tmp_path / "streams.arrow")
    train, heldout = build_elmo_datasets([tmp_path / "streams.arrow"], ["<S>", "</S>", "<UNK>", "the", "ship"],
                                         window=4, batch_size=2, holdout_books_fraction=0.1, holdout_max_books=3,
                                         seed=0, char_inputs=False)
    assert len(heldout.books) == (2 if scale == 1 else 3)
    assert len(train.books) + len(heldout.books) == 20 * scale


def test_a_shard_tasks_arguments_do_not_grow_with_the_number_of_shards(tmp_path):
    """Every BERT examples task was handed the list of all shard paths: arguments growing as shards squared, 515 MB
    in Ray's object store at 2 GB of books (3,449 shards)."""
    import pickle

    from omegaconf import OmegaConf

    from pipeline.bert.data_stages import examples

    def largest_task_arguments(num_shards: int) -> int:
        prepare = tmp_path / f"{num_shards:05d}"
        prepare.mkdir()
        shards = [{"file": f"shard-{i:05d}.arrow"} for i in range(num_shards)]
        (prepare / "manifest.json").write_text(json.dumps({"shards": shards, "totals": {"files_kept": num_shards}}))
        tasks = []

        class Context:  # what the stage asks of its StageContext
            cfg = OmegaConf.create({"examples": {"short_seq_prob": 0.1, "dupe_factor": 1, "max_seq_length": 32,
                                                 "packing": "sentence_pairs"},
                                    "seed": 1})
            out_dir = tmp_path

            def stage_dir(self, name):
                return prepare

            def map_shards(self, fn, shard_args, *args):
                tasks.extend((i, shard, *args) for i, shard in enumerate(shard_args))
                return [0] * len(shard_args)

        examples(Context(), "examples.max_seq_length")
        assert len(tasks) == num_shards
        return max(len(pickle.dumps(task)) for task in tasks)

    assert largest_task_arguments(1000) <= largest_task_arguments(10) + 8
