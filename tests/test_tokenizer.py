import json
import random

import pytest

from data_prep.tokenizer import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    encode_batch_ids,
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
