import json
import random
import re
from collections import Counter

import pytest
from tokenizers import normalizers, pre_tokenizers

from data_prep.corpus.tokenizer import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    count_words,
    encode_batch_ids,
    learn_wordpieces,
    load_tokenizer,
    train_wordpiece,
)

WORDS = ["the", "river", "rivers", "running", "runner", "jumped", "jumping", "quietly", "Café", "old", "house"]


def _corpus(num_sentences=400, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + " ." for _ in range(num_sentences)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("tokenizer")
    # A generator: the trainer must not need a list of the corpus.
    train_wordpiece((s for s in _corpus()), out_dir, vocab_size=150, min_frequency=2)
    return out_dir


def test_special_token_ids_are_fixed(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID) == (0, 1, 2, 3, 4)
    assert 5 < tokenizer.get_vocab_size() <= 150
    vocab_lines = (tokenizer_dir / "vocab.txt").read_text().splitlines()
    assert vocab_lines[:5] == list(SPECIAL_TOKENS)
    assert len(vocab_lines) == tokenizer.get_vocab_size()


def test_round_trip_and_bert_templates(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    text = "The old runner jumped quietly"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == CLS_ID and encoding.ids[-1] == SEP_ID
    assert tokenizer.decode(encoding.ids) == text.lower()
    assert "[UNK]" not in encoding.tokens
    # Accents are stripped with lowercasing, as in BERT uncased.
    assert tokenizer.decode(tokenizer.encode("Café").ids) == "cafe"

    pair = tokenizer.encode("the river", "old house")
    assert pair.ids[0] == CLS_ID and pair.ids.count(SEP_ID) == 2
    first_sep = pair.ids.index(SEP_ID)
    assert set(pair.type_ids[: first_sep + 1]) == {0} and set(pair.type_ids[first_sep + 1 :]) == {1}


def test_encode_batch_ids_has_no_special_tokens(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    texts = ["the river", "running quietly", ""]
    ids = encode_batch_ids(tokenizer, texts)
    assert ids[:2] == [tokenizer.encode(t, add_special_tokens=False).ids for t in texts[:2]]
    assert ids[2] == []
    assert not {CLS_ID, SEP_ID, PAD_ID} & {i for seq in ids for i in seq}
    # Unknown characters map to [UNK] rather than failing.
    assert encode_batch_ids(tokenizer, ["☃"]) == [[UNK_ID]]


def test_loads_in_transformers(tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    ours = load_tokenizer(tokenizer_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(str(tokenizer_dir))
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
    text = "The rivers running past the old house ."
    assert hf(text)["input_ids"] == ours.encode(text).ids
    assert hf.model_max_length == 512
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizerFast" and config["do_lower_case"] is True


def test_cased_tokenizer_keeps_case(tmp_path):
    tokenizer = train_wordpiece(_corpus(), tmp_path, vocab_size=150, lowercase=False)
    assert tokenizer.decode(tokenizer.encode("Café").ids) == "Café"


def test_missing_tokenizer_error_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_wordpiece"):
        load_tokenizer(tmp_path)


def test_training_twice_gives_the_same_ids(tmp_path):
    # tokenizers' own trainer numbered its pieces in hash-map order, different on every call: on this corpus the
    # ids (so every example and embedding row downstream) changed from one training to the next.
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    sentences = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(2000)]
    trained = [train_wordpiece(sentences, tmp_path / str(i), vocab_size=200) for i in range(4)]
    vocab = trained[0].get_vocab()
    assert len(vocab) == 200 and all(t.get_vocab() == vocab for t in trained[1:])
    assert (tmp_path / "3" / "tokenizer.json").read_text() == (tmp_path / "0" / "tokenizer.json").read_text()


def test_wordpieces_are_bpe_merges_with_ties_to_the_earliest_pieces():
    # "aab" x3, "ab" x2. Alphabet by frequency (a: 8, b: 5), then the continuation pieces. Pairs: (a, ##a) 3,
    # (##a, ##b) 3, (a, ##b) 2: the tie goes to (a, ##a), whose pieces come first; then (aa, ##b) 3, then (a, ##b) 2.
    words = Counter({"aab": 3, "ab": 2})
    assert learn_wordpieces(words, 100, min_frequency=2, limit_alphabet=10) == ["a", "b", "##a", "##b", "aa", "aab",
                                                                                 "ab"]
    assert learn_wordpieces(words, 100, min_frequency=3, limit_alphabet=10) == ["a", "b", "##a", "##b", "aa", "aab"]
    assert learn_wordpieces(words, 5, min_frequency=2, limit_alphabet=10) == ["a", "b", "##a", "##b", "aa"]
    # A character outside the alphabet is left out of the words (and encodes as [UNK]).
    assert learn_wordpieces(Counter({"ab": 3, "c": 1}), 100, min_frequency=2, limit_alphabet=2) == [
        "a", "b", "##b", "ab"]


def test_words_are_counted_as_the_tokenizer_splits_them():
    words = count_words(["Hello, world!\tHELLO\u00a0again", "world's end"],
                        normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer())
    assert words == Counter({"hello": 2, "world": 2, ",": 1, "!": 1, "again": 1, "'": 1, "s": 1, "end": 1})


def test_a_vocabulary_too_small_for_the_corpus_alphabet_is_refused(tmp_path):
    """Issue 39, defect 5: vocab_size=10 kept the specials and `e t a o n`, every other word was [UNK] and pretraining
    scored "MLM acc 0.78" predicting it; vocab_size=3 gave 97 entries (a negative slice of the pieces)."""
    sentences = _corpus()
    with pytest.raises(ValueError, match=r"tokenizer.vocab_size=10 is too small for this corpus: 5 pieces cannot spell "
                                         r"its \d+ characters .* set tokenizer.vocab_size to at least (\d+)") as err:
        train_wordpiece(sentences, tmp_path / "small", vocab_size=10)
    smallest = int(re.search(r"at least (\d+)", str(err.value)).group(1))
    with pytest.raises(ValueError, match="tokenizer.vocab_size=3 leaves no room for word pieces"):
        train_wordpiece(sentences, tmp_path / "tiny", vocab_size=3)
    from data_prep.corpus.tokenizer import unknown_tokens

    tokenizer = train_wordpiece(sentences, tmp_path / "smallest", vocab_size=smallest)
    assert tokenizer.get_vocab_size() == smallest
    assert unknown_tokens(tokenizer, sentences)[0] == 0  # every word can be spelled out


def test_unknown_rates_are_counted_and_warned_about_above_one_percent(tmp_path, capsys):
    from data_prep.corpus.tokenizer import unknown_rate_summary, unknown_tokens, unknown_words

    sentences = _corpus()
    # a letter outside the alphabet (limit_alphabet keeps the most frequent characters) makes its words [UNK]
    tokenizer = train_wordpiece(sentences, tmp_path, vocab_size=200, min_frequency=1, limit_alphabet=20)
    unknown, total = unknown_tokens(tokenizer, sentences)
    expected = sum(tokenizer.encode(s, add_special_tokens=False).ids.count(UNK_ID) for s in sentences)
    assert unknown == expected > 0 and total == sum(len(tokenizer.encode(s, add_special_tokens=False).ids)
                                                    for s in sentences)
    summary = unknown_rate_summary(unknown, total, "tokenizer.vocab_size")
    assert summary["unknown_rate"] == round(unknown / total, 6) > 0.01
    assert "raise tokenizer.vocab_size" in summary["unknown_rate_warning"]
    assert "WARNING: " in capsys.readouterr().out
    assert unknown_words(Counter({"a": 90, "b": 9, "c": 1}), ["<unk>", "a", "b"]) == (1, 100)
    assert unknown_rate_summary(1, 100, "elmo.vocab_size", unit="words") == {"unknown_rate": 0.01,
                                                                            "unknown_rate_warning": None}
