"""The fine-tune table's classic baselines (pipeline/downstream/baselines.py)."""
from __future__ import annotations

import random
from unittest.mock import ANY

import numpy as np
import pytest

from pipeline.downstream.baselines import bow_logreg_scores, w2v_mean_scores
from pipeline.downstream.task_data import tsv_splits
from pipeline.downstream.tasks import TaskSplit, load_task
from pipeline.downstream.word2vec import Word2VecConfig, train_word2vec
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, VERBS, write_sentiment_task


def test_bow_logreg_learns_a_label_carried_by_words_where_majority_class_cannot(tmp_path):
    write_sentiment_task(tmp_path / "SST-2", n_train=120, n_dev=60)
    task = load_task("sst2")
    train, dev, majority = tsv_splits(task, tmp_path / "SST-2", None, 0)
    scores = bow_logreg_scores(task, train, dev, seed=0)
    assert set(scores) == {"accuracy"}
    assert scores["accuracy"] > 0.9 > 0.7 > majority["accuracy"]


def test_the_baselines_fit_on_one_blas_thread_whatever_the_process_has(tmp_path, monkeypatch):
    """lbfgs's sums on two BLAS threads reached another C than on one (bow_logreg on all of Rotten Tomatoes, seed 2:
    0.7764 against 0.7831), so a baseline's row depended on the thread count of the Ray worker that fitted it."""
    from sklearn.linear_model import LogisticRegressionCV
    from threadpoolctl import threadpool_info, threadpool_limits

    threads_in_fit = []
    fit = LogisticRegressionCV.fit

    def recording_fit(self, *args, **kwargs):
        threads_in_fit.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(LogisticRegressionCV, "fit", recording_fit)
    write_sentiment_task(tmp_path / "SST-2", n_train=120, n_dev=60)
    task = load_task("sst2")
    train, dev, _ = tsv_splits(task, tmp_path / "SST-2", None, 0)
    with threadpool_limits(limits=2, user_api="blas"):
        bow_logreg_scores(task, train, dev, seed=0)
        assert {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"} == {2}
    assert threads_in_fit == [{1}]


def test_bow_logreg_fits_one_example_of_each_class(tmp_path):
    """finetune.train_sizes=[2] on two labels (or such a train split) failed in StratifiedKFold,
    `n_splits=2 cannot be greater than the number of members in each class`, after every model had been fine-tuned."""
    task = load_task("sst2")
    train = TaskSplit(["a wonderful film", "an awful film"], None, [1, 0])
    dev = TaskSplit(["wonderful", "awful", "a wonderful story", "an awful story"], None, [1, 0, 1, 0])
    assert bow_logreg_scores(task, train, dev, seed=0) == {"accuracy": 1.0}


def test_bow_logreg_reads_both_texts_of_a_pair_task(tmp_path):
    """RTE-like pairs whose label is carried by the second text only: a baseline reading text_a alone is at chance."""
    rng = random.Random(0)
    (tmp_path / "RTE").mkdir()
    for name, n in (("train.tsv", 120), ("dev.tsv", 60)):
        rows = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(n):
            entailed = rng.random() < 0.5
            rows.append(f"{i}\t{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}\t"
                        f"it was {rng.choice(POSITIVE if entailed else NEGATIVE)}\t"
                        f"{'entailment' if entailed else 'not_entailment'}")
        (tmp_path / "RTE" / name).write_text("\n".join(rows) + "\n")
    task = load_task("rte")
    train, dev, majority = tsv_splits(task, tmp_path / "RTE", None, 0)
    assert bow_logreg_scores(task, train, dev, seed=0)["accuracy"] > 0.9 > 0.7 > majority["accuracy"]


def test_w2v_mean_learns_what_word2vec_learned_from_unlabelled_text(tmp_path):
    """Labelled sentences each carry one sentiment word that the few labelled examples never show in that class's
    position; word2vec, trained on unlabelled text in which the words of a class share contexts, puts them together,
    so the mean vector generalises from 20 labels where bag-of-words cannot (it never saw the dev words)."""
    rng = random.Random(0)
    positive, negative = [f"good{i}" for i in range(20)], [f"bad{i}" for i in range(20)]
    corpus = tmp_path / "sentences.txt"
    corpus.write_text("".join(f"{' '.join(rng.choice(['joy', 'smile', 'laugh', 'sun']) for _ in range(4))} {w} "
                              f"{' '.join(rng.choice(['joy', 'smile', 'laugh', 'sun']) for _ in range(4))}\n"
                              if w in positive else
                              f"{' '.join(rng.choice(['rain', 'cry', 'grim', 'loss']) for _ in range(4))} {w} "
                              f"{' '.join(rng.choice(['rain', 'cry', 'grim', 'loss']) for _ in range(4))}\n"
                              for _ in range(3000) for w in [rng.choice(positive + negative)]))
    settings = Word2VecConfig(vector_size=16, window=4, min_count=1, skip_gram=True, negative=5, epochs=5)
    vectors = train_word2vec(corpus, settings, seed=1)
    assert train_word2vec(corpus, settings, seed=1).vectors.tolist() == vectors.vectors.tolist()  # reproducible

    def split(words_by_label):
        texts, labels = [], []
        for label, words in words_by_label:
            for w in words:
                texts.append(f"the film was {w}")
                labels.append(label)
        return TaskSplit(texts, None, labels)

    train = split([(1, positive[:10]), (0, negative[:10])])
    dev = split([(1, positive[10:]), (0, negative[10:])])
    task = load_task("sst2")
    assert w2v_mean_scores(task, train, dev, seed=0, vectors=vectors)["accuracy"] > 0.9
    assert bow_logreg_scores(task, train, dev, seed=0)["accuracy"] < 0.7


def test_a_min_count_that_leaves_no_vocabulary_names_the_key_and_the_count_that_would_work(tmp_path):
    """A corpus whose words are all rare: gensim's own "you must first build vocabulary before training the model"
    said nothing of word2vec.min_count."""
    corpus = tmp_path / "sentences.txt"
    corpus.write_text("the river ran on .\nthe garden slept .\nthe city woke .\n")
    with pytest.raises(ValueError) as error:
        train_word2vec(corpus, Word2VecConfig(vector_size=8, min_count=5), seed=1)
    message = str(error.value)
    assert "word2vec.min_count=5 leaves no vocabulary" in message
    assert "9 distinct words" in message and "none occurs 5 times or more" in message
    assert "set word2vec.min_count=3 or lower" in message  # 'the' and '.' occur three times
    assert train_word2vec(corpus, Word2VecConfig(vector_size=8, min_count=3), seed=1).words[:2] in {
        ("the", "."), (".", "the")}


def test_coverage_counts_the_tasks_words_with_a_vector_and_leaves_punctuation_out():
    from data_prep.corpus.word_vectors import WordVectors
    from pipeline.downstream.baselines import w2v_mean_coverage, word_coverage

    vectors = WordVectors((".", "ship", "sea"), np.ones((3, 2), dtype=np.float32))
    assert word_coverage(["The ship .", "A ship , at sea !"], vectors) == 3 / 6
    train, dev = TaskSplit(["the ship ."], ["a sea"], [1]), TaskSplit(["the boat ."], None, [0])
    assert w2v_mean_coverage("pairs", train, dev, vectors, min_coverage=0.5) == {"coverage": 0.3333,
                                                                                "coverage_warning": ANY}
    assert w2v_mean_coverage("pairs", train, dev, vectors, min_coverage=0.3) == {"coverage": 0.3333}
