import random

import pytest

from data_prep.corpus.tokenizer import CLS_ID, SEP_ID, train_wordpiece
from data_prep.tasks.conll import (
    TaggedSentence,
    encode_tagged_sentences,
    iob1_to_iob2,
    label_set,
    read_conll,
    word_level_tags,
)
from models import IGNORE_INDEX

CONLL_TEXT = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- O O

Smith NNP B-NP I-PER
Jones NNP I-NP B-PER"""  # no blank line at the end of the file: the last sentence still counts

LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    words = ["the", "eu", "rejects", "german", "call", "peter", "blackburn", "smith", "jones", "river", "runs"]
    corpus = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)]
    return train_wordpiece(corpus, tmp_path_factory.mktemp("tok"), vocab_size=80, min_frequency=1)


def test_read_conll_sentences_docstart_and_last_sentence(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text(CONLL_TEXT)
    sentences = read_conll(path)
    assert [s.tokens for s in sentences] == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"],
                                             ["Smith", "Jones"]]
    assert sentences[0].tags == ["I-ORG", "O", "I-MISC", "O"]
    assert sentences[2].tags == ["I-PER", "B-PER"]


def test_read_conll_names_file_and_line_of_a_malformed_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP I-ORG\nrejects VBZ O\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected 4 space-separated columns.*got 3"):
        read_conll(path)
    path.write_text("EU NNP B-NP I-ORG\n\nrejects VBZ B-VP ORG\n")
    with pytest.raises(ValueError, match=r"bad.txt:3: tag 'ORG' is not IOB"):
        read_conll(path)
    path.write_text("\n-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(ValueError, match="no tagged words"):
        read_conll(path)
    with pytest.raises(FileNotFoundError, match="finetune.data_dir"):
        read_conll(tmp_path / "missing.txt")


def test_iob1_to_iob2():
    assert iob1_to_iob2(["I-ORG", "O", "I-MISC", "I-MISC"]) == ["B-ORG", "O", "B-MISC", "I-MISC"]
    # adjacent entities of one type (B- in IOB1) and a type change without O
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "I-PER", "I-LOC"]) == ["B-PER", "I-PER", "B-PER", "I-PER",
                                                                          "B-LOC"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2


def test_label_set_orders_o_then_type_then_b_before_i():
    sentences = [TaggedSentence(["a", "b", "c"], ["B-PER", "I-PER", "O"]), TaggedSentence(["d"], ["B-LOC"])]
    assert label_set(sentences) == ["O", "B-LOC", "B-PER", "I-PER"]


def test_first_sub_token_gets_the_label_and_the_rest_are_ignored(tokenizer):
    sentence = TaggedSentence(["Peterson", "Smith", "runs"], ["B-PER", "I-PER", "O"])
    [feature] = encode_tagged_sentences(tokenizer, [sentence], LABELS, max_seq_length=32)
    tokens = [tokenizer.id_to_token(i) for i in feature["input_ids"]]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert feature["input_ids"][0] == CLS_ID and feature["input_ids"][-1] == SEP_ID
    word_ids = feature["word_ids"].tolist()
    assert word_ids.count(0) > 1, tokens  # "Peterson" is not in the vocabulary: split into several pieces
    assert word_ids[0] == word_ids[-1] == -1
    expected = []
    for position, word in enumerate(word_ids):
        first = word >= 0 and word_ids[position - 1] != word
        expected.append(LABELS.index(sentence.tags[word]) if first else IGNORE_INDEX)
    assert feature["labels"].tolist() == expected
    assert sum(label != IGNORE_INDEX for label in expected) == 3
    assert feature["token_type_ids"].tolist() == [0] * len(tokens)
    assert tokenizer.truncation is None  # the shared tokenizer is left as it was


def test_truncation_and_word_level_decoding(tokenizer):
    sentences = [TaggedSentence(["EU", "rejects", "German", "call", "Peter", "Blackburn"],
                                ["B-ORG", "O", "B-MISC", "O", "B-PER", "I-PER"]),
                 TaggedSentence(["Smith"], ["B-PER"])]
    features = encode_tagged_sentences(tokenizer, sentences, LABELS, max_seq_length=6)
    assert [len(f["input_ids"]) for f in features][0] == 6
    assert [f["example_index"] for f in features] == [0, 1]
    for feature, sentence in zip(features, sentences):
        # decoding the gold token labels gives back the gold word tags, except words cut by truncation (O)
        decoded = word_level_tags(feature["labels"], feature["word_ids"], LABELS, len(sentence.tokens))
        kept = {w for w in feature["word_ids"].tolist() if w >= 0}
        assert decoded == [tag if w in kept else "O" for w, tag in enumerate(sentence.tags)]
    assert len({w for w in features[0]["word_ids"].tolist() if w >= 0}) < 6


def test_word_level_tags_ignore_predictions_on_later_sub_tokens():
    # [CLS] peter black ##burn [SEP]: the prediction on "##burn" (position 3) is not used
    tags = word_level_tags([0, 7, 8, 1, 0], [-1, 0, 1, 1, -1], LABELS, num_words=2)
    assert tags == ["B-PER", "I-PER"]


def test_encode_rejects_tags_outside_the_task_labels(tokenizer):
    with pytest.raises(ValueError, match=r"tags \['B-DATE'\] are not in the task's labels"):
        encode_tagged_sentences(tokenizer, [TaggedSentence(["x"], ["B-DATE"])], LABELS, max_seq_length=8)


def test_read_conll_takes_the_word_and_tag_columns_a_task_names(tmp_path):
    path = tmp_path / "train.txt"  # CoNLL-2000 chunking: word POS chunk
    path.write_text("Confidence NN B-NP\nin IN B-PP\nthe DT B-NP\npound NN I-NP\n\nRockwell NNP B-NP\n")
    chunks = read_conll(path, word_column=0, tag_column=2)
    assert [s.tags for s in chunks] == [["B-NP", "B-PP", "B-NP", "I-NP"], ["B-NP"]]
    assert read_conll(path, tag_column=1, iob=False)[0].tags == ["NN", "IN", "DT", "NN"]
    with pytest.raises(ValueError, match=r"train.txt:1: tag 'NN' is not IOB.*tag_scheme: none"):
        read_conll(path, tag_column=1)
    with pytest.raises(ValueError, match=r"train.txt:1: expected 4 space-separated columns \(the word in column 0 "
                                         r"and the tag in column 3"):
        read_conll(path, tag_column=3)


def test_a_pos_task_yaml_reads_tags_as_they_are_and_scores_token_accuracy(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    from pipeline.bert.downstream import load_task_data
    from pipeline.downstream.task_data import conll_sentences
    from pipeline.downstream.tasks import load_task

    (tmp_path / "eng.train").write_text(CONLL_TEXT)
    (tmp_path / "eng.testa").write_text(CONLL_TEXT)
    task = load_task("conll2003_pos")
    assert conll_sentences(task, tmp_path, "eng.train")[0].tags == ["NNP", "VBZ", "JJ", "NN"]
    data = load_task_data(task, tmp_path, tokenizer, 16, None, 0)
    assert data.make_module.keywords["metric"] == "token_accuracy"
    with pytest.raises(ValueError, match="tag_scheme 'bio' is not one of"):
        conll_sentences(OmegaConf.merge(task, {"tag_scheme": "bio"}), tmp_path, "eng.train")
