"""The fine-tune table's classic baselines (pipeline/downstream/baselines.py)."""
from __future__ import annotations

import random

from pipeline.downstream.baselines import bow_logreg_scores
from pipeline.downstream.task_data import tsv_splits
from pipeline.downstream.tasks import load_task
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, VERBS, write_sentiment_task


def test_bow_logreg_learns_a_label_carried_by_words_where_majority_class_cannot(tmp_path):
    write_sentiment_task(tmp_path / "SST-2", n_train=120, n_dev=60)
    task = load_task("sst2")
    train, dev, majority = tsv_splits(task, tmp_path / "SST-2", None, 0)
    scores = bow_logreg_scores(task, train, dev, seed=0)
    assert set(scores) == {"accuracy"}
    assert scores["accuracy"] > 0.9 > 0.7 > majority["accuracy"]


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
