import math

import numpy as np
import pytest

from pipeline.evaluation.metrics import (
    METRICS,
    accuracy,
    average_ranks,
    binary_f1,
    entity_scores,
    entity_spans,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    score_task,
    spearman,
    squad_f1,
    squad_scores,
)


def test_accuracy_and_length_mismatch():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    with pytest.raises(ValueError, match="3 predictions for 2 references"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        accuracy([], [])


def test_binary_f1_with_configurable_positive_label():
    predictions, references = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    # positive 1: tp=2, fp=1, fn=1 -> P=R=2/3
    assert binary_f1(predictions, references) == pytest.approx(2 / 3)
    # positive 0: tp=1, fp=1, fn=1 -> 1/2
    assert binary_f1(predictions, references, positive=0) == pytest.approx(0.5)
    assert binary_f1(["no", "no"], ["no", "no"], positive="yes") == 0.0


def test_matthews_corrcoef_by_hand():
    # tp=2 tn=1 fp=1 fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert matthews_corrcoef([1, 1, 1, 0, 0], [1, 1, 0, 0, 1]) == pytest.approx(1 / 6)
    assert matthews_corrcoef([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant prediction: undefined, reported as 0


def test_matthews_corrcoef_multiclass():
    # sklearn.metrics.matthews_corrcoef([0, 1, 2, 2, 1], [0, 1, 2, 1, 1]) with (y_true, y_pred) swapped is symmetric
    references, predictions = [0, 1, 2, 1, 1], [0, 1, 2, 2, 1]
    # c=4, s=5, t=(1,3,1), p=(1,2,2): (4*5 - 9) / sqrt((25-9)*(25-11)) = 11 / sqrt(224)
    assert matthews_corrcoef(predictions, references) == pytest.approx(11 / math.sqrt(224))


def test_pearson_and_spearman():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # x=(1,2,3,4), y=(1,3,2,4): cov 4 / sqrt(5*5)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(pearson([2, 2, 2], [1, 2, 3]))
    # monotone but non-linear: Spearman 1, Pearson below 1
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 4, 9, 100]) < 0.9


def test_spearman_averages_tied_ranks():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert average_ranks([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]
    # ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): scipy.stats.spearmanr gives 0.9486832980505138
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    # ranks of y: 1, 3, 2, 4. Centred: (-1.5, 0, 0, 1.5) and (-1.5, .5, -.5, 1.5); products sum to 4.5, squares to
    # 4.5 and 5, so rho = 4.5 / sqrt(22.5) = 3 / sqrt(10).
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))


def test_metrics_take_numpy_arrays_and_return_plain_floats():
    """The SentEval probes score numpy arrays (argmax predictions, int64 labels, float scores) with these same
    functions; the results go to JSON, so they must be Python floats, not numpy scalars."""
    labels = np.array([1, 1, 0, 1, 0], dtype=np.int64)
    predicted = np.array([1, 1, 1, 0, 0], dtype=np.int64)
    scores = (accuracy(predicted, labels), binary_f1(predicted, labels),
              pearson(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0])),
              spearman(np.array([1, 2, 2, 3]), np.array([1, 3, 2, 4])))
    assert [type(s) for s in scores] == [float] * 4
    # tp = 2, fp = 1, fn = 1: accuracy 3/5, F1 = 4 / 6
    assert scores[:2] == pytest.approx((3 / 5, 2 / 3))
    assert average_ranks(np.array([5, 1, 5, 5])).tolist() == [3.0, 1.0, 3.0, 3.0]


def test_entity_spans_iob2_and_iob1():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    # IOB1: I- opens an entity after O or after another type
    assert entity_spans(["I-PER", "I-PER", "O", "I-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    assert entity_spans(["I-PER", "I-LOC", "I-LOC"]) == {("PER", 0, 0), ("LOC", 1, 2)}


def test_entity_spans_conlleval_edge_cases():
    # entity at the end of the sentence is closed
    assert entity_spans(["O", "B-ORG", "I-ORG"]) == {("ORG", 1, 2)}
    # I- without B- at the start of the sentence
    assert entity_spans(["I-MISC", "O"]) == {("MISC", 0, 0)}
    # IOB1: adjacent entities of the same type are separated by B-
    assert entity_spans(["I-PER", "I-PER", "B-PER", "I-PER"]) == {("PER", 0, 1), ("PER", 2, 3)}
    # B- directly after B- of the same type: two one-word entities
    assert entity_spans(["B-LOC", "B-LOC"]) == {("LOC", 0, 0), ("LOC", 1, 1)}
    # I- of another type after B- starts a new entity
    assert entity_spans(["B-LOC", "I-ORG"]) == {("LOC", 0, 0), ("ORG", 1, 1)}
    assert entity_spans(["O", "O"]) == set()


def test_entity_spans_rejects_non_iob_tags():
    with pytest.raises(ValueError, match="'PER' is not IOB"):
        entity_spans(["PER"])
    with pytest.raises(ValueError, match="'E-PER' is not IOB"):
        entity_spans(["E-PER"])


def test_entity_scores_exact_span_match():
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predictions = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-MISC"]]
    # gold spans: PER 0-1, LOC 3, ORG 0 (3); predicted: PER 0-0, LOC 3, ORG 0, MISC 1 (4); correct: LOC, ORG (2)
    scores = entity_scores(predictions, references)
    assert scores["precision"] == pytest.approx(2 / 4)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_entity_scores_iob1_and_iob2_encodings_of_the_same_entities_agree():
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    assert entity_scores(iob1, iob2) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


def test_entity_scores_without_entities_and_with_length_mismatch():
    assert entity_scores([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 words"):
        entity_scores([["O"]], [["O", "O"]])


def test_squad_normalize_answer_is_the_official_one():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_squad_f1_and_exact_match():
    assert squad_f1("the cat sat", "a cat sat down") == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert squad_f1("dog", "cat") == 0.0
    scores = squad_scores(["Denver Broncos", "in 1990", "blue"],
                          [["Denver Broncos", "Broncos"], ["1990", "the year 1990"], ["red"]])
    # EM: 1 + 0 + 0; F1: 1 + max(2*0.5*1/1.5, 2*0.5*0.5/1) + 0
    assert scores["exact_match"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx((1 + 2 / 3) / 3)


def test_squad_scores_need_answer_lists():
    with pytest.raises(ValueError, match="non-empty list of answer strings"):
        squad_scores(["x"], ["x"])


def test_score_task_returns_every_number_of_the_task_metric():
    assert score_task("accuracy_f1", [1, 0, 1], [1, 1, 1]) == pytest.approx({"accuracy": 2 / 3, "f1": 0.8})
    stsb = score_task("pearson_spearman", [0.1, 0.4, 0.3], [1.0, 4.0, 3.5])
    assert set(stsb) == {"pearson", "spearman"} and stsb["spearman"] == pytest.approx(1.0)
    assert set(score_task("entity_f1", [["B-PER"]], [["B-PER"]])) == {"precision", "recall", "f1"}
    assert set(score_task("squad", ["a"], [["a"]])) == {"exact_match", "f1"}
    assert set(METRICS) >= {"accuracy", "matthews_corrcoef"}
    with pytest.raises(ValueError, match="unknown metric 'bleu'.*known metrics: accuracy"):
        score_task("bleu", [1], [1])


def test_token_accuracy_counts_words_over_all_sentences():
    assert score_task("token_accuracy", [["NN", "VB"], ["DT"]], [["NN", "NN"], ["DT"]]) == {"accuracy": 2 / 3}
    with pytest.raises(ValueError, match="sentence 1: 2 predicted tags for 1 words"):
        score_task("token_accuracy", [["NN"], ["DT", "NN"]], [["NN"], ["DT"]])
