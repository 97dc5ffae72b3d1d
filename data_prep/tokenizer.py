"""BERT-style WordPiece tokenizer: training, saving in Hugging Face format, loading and fast id encoding.

The tokenizer reproduces the pipeline of google-research/bert's ``tokenization.FullTokenizer`` (BasicTokenizer:
clean text, split CJK characters, optional lowercasing and accent stripping, split on whitespace and punctuation;
then greedy longest-match-first WordPiece with "##" continuation pieces) using the Rust ``tokenizers`` library.

Special tokens sit at fixed ids so that model and data code can refer to them without a vocabulary lookup:

    ===== ===  =========================================================
    token  id  use
    ===== ===  =========================================================
    [PAD]   0  padding; id 0 so that zero-initialised buffers are padding
    [UNK]   1  out-of-vocabulary word (WordPiece could not split it)
    [CLS]   2  first token of every sequence; its state feeds the NSP head
    [SEP]   3  ends segment A and segment B
    [MASK]  4  replaces tokens selected for the masked-LM objective
    ===== ===  =========================================================

(The released BERT vocabularies use 0/100/101/102/103; a freshly trained vocabulary has no reason to keep the
99 unused slots in between.)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# The WordPiece trainer assigns ids to special tokens in list order, before any learned piece: this order *is*
# the id assignment documented above.
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
CONTINUATION_PREFIX = "##"

TOKENIZER_FILE = "tokenizer.json"
# Sentences handed to the Rust trainer per Python call: large enough to amortise the Python/Rust boundary,
# small enough that only one batch of the corpus is ever held in memory.
_TRAIN_BATCH_SIZE = 1000


def _batches(sentences: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(sentences)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def train_wordpiece(
    sentences: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 30522,
    min_frequency: int = 2,
    lowercase: bool = True,
    limit_alphabet: int = 1000,
    model_max_length: int = 512,
) -> Tokenizer:
    """Train a BERT WordPiece tokenizer on ``sentences`` and save it in Hugging Face format in ``out_dir``.

    ``sentences`` is consumed once, in batches, so memory depends on the number of distinct words, not on the
    size of the corpus. Defaults follow BERT-base uncased (vocabulary of 30,522 pieces, lowercased, accents
    stripped). ``out_dir`` receives ``tokenizer.json`` (for :func:`load_tokenizer`) plus ``vocab.txt``,
    ``tokenizer_config.json`` and ``special_tokens_map.json`` so that
    ``transformers.BertTokenizerFast.from_pretrained(out_dir)`` loads the same tokenizer.
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK_TOKEN, continuing_subword_prefix=CONTINUATION_PREFIX))
    # strip_accents=None follows `lowercase`, as BERT's BasicTokenizer does (uncased models strip accents,
    # cased ones keep them).
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix=CONTINUATION_PREFIX,
        show_progress=False,  # progress bars garble the interleaved logs of parallel (Ray) workers
    )
    tokenizer.train_from_iterator(_batches(sentences, _TRAIN_BATCH_SIZE), trainer=trainer)
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            raise RuntimeError(
                f"trained vocabulary put {token} at id {tokenizer.token_to_id(token)}, expected {expected_id}; "
                f"this tokenizers version assigns special-token ids differently, pin tokenizers==0.23.3"
            )
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("the training corpus yielded no word pieces; pass non-empty sentences to train_wordpiece")
    # BERT's input format: [CLS] A [SEP] for one segment, [CLS] A [SEP] B [SEP] with token type 1 on B's side.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS_TOKEN} $A {SEP_TOKEN}",
        pair=f"{CLS_TOKEN} $A {SEP_TOKEN} $B:1 {SEP_TOKEN}:1",
        special_tokens=[(CLS_TOKEN, CLS_ID), (SEP_TOKEN, SEP_ID)],
    )
    save_hf_tokenizer(tokenizer, Path(out_dir), lowercase=lowercase, model_max_length=model_max_length)
    return tokenizer


def save_hf_tokenizer(tokenizer: Tokenizer, out_dir: Path, *, lowercase: bool, model_max_length: int) -> None:
    """Write `tokenizer` (trained by :func:`train_wordpiece` with `lowercase`) as the files of a transformers
    ``BertTokenizerFast``; `model_max_length` is the longest input the model it goes with was trained on."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / TOKENIZER_FILE))
    tokenizer.model.save(str(out_dir))  # WordPiece writes vocab.txt, one piece per line in id order
    special_tokens_map = {
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "cls_token": CLS_TOKEN,
        "sep_token": SEP_TOKEN,
        "mask_token": MASK_TOKEN,
    }
    config = {
        "tokenizer_class": "BertTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        **special_tokens_map,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_tokens_map, indent=2) + "\n")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved by :func:`train_wordpiece` (reads ``directory/tokenizer.json``)."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; train a tokenizer into {directory} with train_wordpiece first")
    return Tokenizer.from_file(str(path))


def encode_batch_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without [CLS]/[SEP] (instances are assembled later from several sentences).

    ``encode_batch_fast`` skips offset tracking, which pretraining never needs; the batch is split over the Rust
    thread pool (RAYON_NUM_THREADS caps it; TOKENIZERS_PARALLELISM=false turns it off).
    """
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
