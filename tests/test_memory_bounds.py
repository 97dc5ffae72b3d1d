"""Each data stage's memory stays bounded when the corpus grows: a tiny corpus and the same made 4x larger, asserting
on the structures a stage allocates (not on time or RSS): the held-out sets."""
from __future__ import annotations

import pytest

from data_prep.skip_thought_examples import write_triples
from pipeline.elmo.module import build_elmo_datasets
from pipeline.engine.arrow import read_arrow
from pipeline.skip_thought.module import SkipThoughtTriples, triple_loaders


@pytest.mark.parametrize("scale", [1, 4])
def test_skip_thought_holds_out_at_most_val_max_triples(tmp_path, scale):
    n = 400 * scale
    write_triples([([i], [i + 1], [i + 2]) for i in range(n)], tmp_path / "t.arrow")
    train, val = triple_loaders(SkipThoughtTriples([read_arrow(tmp_path / "t.arrow")]), batch_size=4,
                                val_fraction=0.1, val_max_triples=50, seed=0)
    assert len(val.dataset) == (40 if scale == 1 else 50)
    assert train.sampler.sampler.num_samples == n - len(val.dataset)


@pytest.mark.parametrize("scale", [1, 4])
def test_elmo_holds_out_at_most_holdout_max_books(tmp_path, scale):
    from data_prep.elmo_examples import write_token_streams

    books = [(f"book-{i}", ["the", "ship", "sailed"] * 5) for i in range(20 * scale)]
    write_token_streams(books, tmp_path / "streams.arrow")
    train, heldout = build_elmo_datasets([tmp_path / "streams.arrow"], ["<S>", "</S>", "<UNK>", "the", "ship"],
                                         window=4, batch_size=2, holdout_books_fraction=0.1, holdout_max_books=3,
                                         seed=0, char_inputs=False)
    assert len(heldout.books) == (2 if scale == 1 else 3)
    assert len(train.books) + len(heldout.books) == 20 * scale
