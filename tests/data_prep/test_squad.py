import json
import random

import numpy as np
import pytest

from data_prep.corpus.tokenizer import train_wordpiece
from data_prep.tasks.squad import CLS_INDEX, best_answers, read_squad, squad_features
from pipeline.evaluation.metrics import squad_scores

WORDS = ["the", "river", "flows", "through", "old", "city", "of", "paris", "in", "france", "where", "does", "what",
         "is", "name", "boats", "sail", "slowly", "seine", "every", "morning"]
# 27 words; the answer "the Seine" is near the end, so with 12 context tokens per window only a later window holds it
CONTEXT = ("The river flows through the old city of Paris in France. Boats sail slowly every morning. "
           "Every morning boats sail through the city. The name of the river is the Seine.")
ANSWER = "the Seine"


def squad_json(answer_start: int) -> dict:
    return {"version": "1.1", "data": [{"title": "Paris", "paragraphs": [{
        "context": CONTEXT,
        "qas": [{"id": "q-river", "question": "What is the name of the river?",
                 "answers": [{"text": ANSWER, "answer_start": answer_start},
                             {"text": "Seine", "answer_start": CONTEXT.index("Seine")}]},
                {"id": "q-city", "question": "Where does the river flow?",
                 "answers": [{"text": "through the old city of Paris", "answer_start": 16}]}]}]}]}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(10)) + " ." for _ in range(300)]
    return train_wordpiece(corpus, tmp_path_factory.mktemp("tok"), vocab_size=120, min_frequency=1)


@pytest.fixture
def examples(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(squad_json(CONTEXT.index(ANSWER))))
    return read_squad(path)


def test_read_squad(examples):
    assert [e.qas_id for e in examples] == ["q-river", "q-city"]
    assert examples[0].answers == ["the Seine", "Seine"] and examples[0].context == CONTEXT
    assert CONTEXT[examples[1].answer_starts[0]:].startswith("through the old city")


def test_read_squad_rejects_a_wrong_answer_start(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(squad_json(CONTEXT.index(ANSWER) + 1)))
    with pytest.raises(ValueError, match=r"train-v1.1.json: question q-river: answer 'the Seine' is not at "
                                         r"answer_start"):
        read_squad(path)


def test_read_squad_rejects_other_layouts(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "x", "questions": []}]}]}))
    with pytest.raises(ValueError, match=r"other.json: not a SQuAD v1.1 JSON file \(KeyError: 'qas'\)"):
        read_squad(path)
    path.write_text("[1, 2")
    with pytest.raises(ValueError, match="not a SQuAD v1.1 JSON file"):
        read_squad(path)


def _context_offsets(feature):
    return [o for o in feature["offsets"] if o is not None]


def test_windows_step_by_doc_stride_and_the_answer_is_only_in_a_later_window(tokenizer, examples):
    features = squad_features(tokenizer, examples[:1], max_seq_length=24, doc_stride=5, max_query_length=64)
    assert len(features) > 2 and all(len(f["input_ids"]) <= 24 for f in features)
    assert tokenizer.truncation is None  # the shared tokenizer is left as it was
    first, second = _context_offsets(features[0]), _context_offsets(features[1])
    assert second[0] == first[5]  # BERT's doc_stride: the next window starts 5 context tokens later
    assert _context_offsets(features[-1])[-1][1] == len(CONTEXT)  # the windows cover the whole context
    assert (features[0]["start_position"], features[0]["end_position"]) == (CLS_INDEX, CLS_INDEX)
    holding = [f for f in features if f["start_position"] != CLS_INDEX]
    assert holding and holding[0] is not features[0]
    for feature in holding:
        start, end = feature["start_position"], feature["end_position"]
        assert CONTEXT[feature["offsets"][start][0]:feature["offsets"][end][1]] == ANSWER
        assert feature["token_type_ids"][start] == 1
        tokens = [tokenizer.id_to_token(i) for i in feature["input_ids"][start:end + 1]]
        assert tokens == ["the", "seine"]


def test_long_questions_are_cut_to_max_query_length(tokenizer, examples):
    [feature] = squad_features(tokenizer, examples[1:], max_seq_length=64, doc_stride=32, max_query_length=3)
    assert feature["token_type_ids"].tolist().index(1) == 1 + 3 + 1  # [CLS] 3 question tokens [SEP]


def test_doc_stride_must_fit_the_window(tokenizer, examples):
    with pytest.raises(ValueError, match="doc_stride 50 must be in 1..*lower doc_stride"):
        squad_features(tokenizer, examples, max_seq_length=24, doc_stride=50, max_query_length=64)


def test_best_answers_decode_the_best_span_over_all_windows(tokenizer, examples):
    features = squad_features(tokenizer, examples, max_seq_length=24, doc_stride=5, max_query_length=64)
    start_logits, end_logits = {}, {}
    for index, feature in enumerate(features):
        length = len(feature["input_ids"])
        start_logits[index], end_logits[index] = np.zeros(length), np.zeros(length)
        if feature["start_position"] != CLS_INDEX:
            start_logits[index][feature["start_position"]] = 5.0
            end_logits[index][feature["end_position"]] = 5.0
        # high scores on [CLS] and the question never win: only context spans are answers
        start_logits[index][:3] = end_logits[index][:3] = 50.0
    predictions = best_answers(examples, features, start_logits, end_logits, n_best_size=20, max_answer_length=30)
    assert predictions["q-river"] == ANSWER
    assert predictions["q-city"] == "through the old city of Paris"
    references = [e.answers for e in examples]
    assert squad_scores([predictions[e.qas_id] for e in examples], references) == {"exact_match": 1.0, "f1": 1.0}
    # the city answer is 6 tokens: with max_answer_length 5 a shorter span wins
    shorter = best_answers(examples, features, start_logits, end_logits, n_best_size=20, max_answer_length=5)
    assert shorter["q-city"] != "through the old city of Paris" and len(shorter["q-city"].split()) <= 5


def test_best_answers_never_return_an_end_before_the_start(tokenizer, examples):
    features = squad_features(tokenizer, examples[1:], max_seq_length=64, doc_stride=32, max_query_length=64)
    [feature] = features
    context_positions = [i for i, o in enumerate(feature["offsets"]) if o is not None]
    starts, ends = np.zeros(len(feature["input_ids"])), np.zeros(len(feature["input_ids"]))
    starts[context_positions[4]], ends[context_positions[2]] = 9.0, 9.0  # best pair (18) is inverted
    starts[context_positions[1]] = 1.0  # best valid pair: 1 + 9
    [answer] = best_answers(examples[1:], features, {0: starts}, {0: ends}, n_best_size=3,
                            max_answer_length=30).values()
    first, last = feature["offsets"][context_positions[1]], feature["offsets"][context_positions[2]]
    assert answer == CONTEXT[first[0]:last[1]]
