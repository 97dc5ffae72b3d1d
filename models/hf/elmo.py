"""ELMo's biLM (models/elmo.py) as a HuggingFace directory: modeling_textrep_elmo.py beside the token layer's and the
LSTMs' weights, and a tokenizer that splits words as the biLM was trained (conventions/elmo_words.py).

A character-CNN biLM reads every word of any text, so its tokenizer spells each word out in UTF-8 bytes, a first-byte
piece then "##" pieces (a WordPiece model over the 512 pieces of the byte-level alphabet): no word is unknown, and the
model gathers the bytes back into its character ids. A word-input biLM gets a word-level tokenizer over its vocabulary.
Either tokenizer wraps the sentence in <S> ... </S>, as ElmoEmbedder does."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from conventions.elmo_words import BOS, EOS, UNK
from models.elmo import BiLanguageModel
from models.hf import write_custom_model

if TYPE_CHECKING:  # never run (it needs transformers): the file is copied, and so part of the code version of
    # every stage that writes it (pipeline/engine/fingerprints.py follows imports)
    from models.hf import modeling_textrep_elmo  # noqa: F401

CUSTOM_CODE = "modeling_textrep_elmo"
CLASSES = {"AutoConfig": "TextrepElmoConfig", "AutoModel": "TextrepElmoModel"}
PAD = "<pad>"
# The character-CNN tokenizer's ids: padding and the markers, then a word's first byte b at FIRST_BYTE_ID + b and any
# later byte at CONTINUATION_BYTE_ID + b (written into config.json, which the modelling code reads them from)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
FIRST_BYTE_ID = 4
CONTINUATION_BYTE_ID = FIRST_BYTE_ID + 256
CONTINUATION = "##"
# WordPiece's longest word before it gives up ([UNK]); every byte is a piece here, so no word is too long
NO_LIMIT = 1 << 30


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (what tokenizers' ByteLevel pre-tokenizer maps bytes to)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    stand_in = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
    return [stand_in[b] for b in range(256)]


def byte_tokenizer() -> Tokenizer:
    """Words split as conventions/elmo_words.split_words splits them, each spelled out in UTF-8 bytes."""
    alphabet = byte_alphabet()
    vocab = {PAD: PAD_ID, BOS: BOS_ID, EOS: EOS_ID, UNK: UNK_ID,
             **{char: FIRST_BYTE_ID + b for b, char in enumerate(alphabet)},
             **{CONTINUATION + char: CONTINUATION_BYTE_ID + b for b, char in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                                           max_input_chars_per_word=NO_LIMIT))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=False)])
    tokenizer.decoder = decoders.Sequence([decoders.WordPiece(prefix=CONTINUATION, cleanup=False),
                                           decoders.ByteLevel()])
    return tokenizer


def word_tokenizer(words: list[str]) -> Tokenizer:
    """One id per word of the biLM's vocabulary (<S>, </S>, <UNK> first), <pad> after them."""
    tokenizer = Tokenizer(models.WordLevel({**{w: i for i, w in enumerate(words)}, PAD: len(words)}, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(cleanup=False)  # words joined by spaces
    return tokenizer


def to_hf(bilm: BiLanguageModel, path, vocab: list[str] | None = None) -> str:
    """Write the biLM's representation layers (not its softmax) and their tokenizer into `path`; a word-input biLM
    needs its vocabulary (`vocab`). Returns the class AutoModel builds."""
    c, path = bilm.config, Path(path)
    char_cnn = c.token_encoder == "char_cnn"
    if not char_cnn and vocab is None:
        raise ValueError("a word-input biLM's tokenizer is its vocabulary: pass vocab=read_word_vocab(...)")
    tokenizer = byte_tokenizer() if char_cnn else word_tokenizer(vocab)
    bos, eos, pad = (tokenizer.token_to_id(t) for t in (BOS, EOS, PAD))
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}",
                                                             special_tokens=[(BOS, bos), (EOS, eos)])
    config = {"architectures": [CLASSES["AutoModel"]], "model_type": "textrep_elmo",
              **{k: getattr(c, k) for k in ("token_encoder", "vocab_size", "max_characters_per_token", "n_characters",
                                            "char_embedding_dim", "filters", "num_highway_layers", "projection_dim",
                                            "lstm_dim", "num_layers")},
              # a word-input biLM has no padding row: its padding id, past the vocabulary, is masked, not looked up
              "pad_token_id": pad if char_cnn else None, "bos_token_id": bos, "eos_token_id": eos,
              "first_byte_id": FIRST_BYTE_ID, "continuation_byte_id": CONTINUATION_BYTE_ID}
    state = {k: v for k, v in bilm.state_dict().items() if not k.startswith("softmax.")}
    write_custom_model(path, CUSTOM_CODE, config, CLASSES, state)
    tokenizer.save(str(path / "tokenizer.json"))
    # no model_max_length: LSTMs have no longest input (transformers' default then is no limit). The markers are never
    # read from the text: "<S>" in a sentence is three words, as split_words gives them
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
        "pad_token": PAD, "split_special_tokens": True}, indent=2) + "\n")
    return CLASSES["AutoModel"]


def describe(config: dict) -> str:
    """What a model card says of the biLM a to_hf directory's config.json describes."""
    if config["token_encoder"] == "char_cnn":
        filters = sum(count for _, count in config["filters"])
        tokens = (f"a character CNN over each word's UTF-8 bytes ({filters} filters of widths "
                  f"{', '.join(str(w) for w, _ in config['filters'])}, highway layers: "
                  f"{config['num_highway_layers']}; words cut to {config['max_characters_per_token'] - 2} bytes)")
    else:
        tokens = f"a word embedding over its {config['vocab_size']} words"
    return (f"An ELMo biLM (Peters et al. 2018): {tokens}, then a forward and a backward stack of "
            f"{config['num_layers']} LSTMs with {config['lstm_dim']} cells projected to {config['projection_dim']}, "
            "a residual connection between layers. AutoModel gives, per word of a sentence, the biLM's "
            f"{config['num_layers'] + 1} layers (`hidden_states`, {2 * config['projection_dim']} values each: forward "
            "and backward), their equal-weight average (`last_hidden_state`) and its mean over the words "
            "(`pooler_output`); the softmax it was trained with is not included.")
