"""Skip-Thought training data: a word vocabulary, sentences as word ids, and (previous, current, next) triples.

Kiros et al. 2015 train on consecutive sentences of books; a triple must never span two books, since the last
sentence of one book says nothing about the first of the next. The functions here are pure (no Ray, no files except
the explicit I/O helpers); the pipeline maps them over the sentence shards, whose rows are ordered by book.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from data_prep.corpus.chinese import segment_chinese
from data_prep.corpus.shards import atomic_arrow_file

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
SPECIAL_WORDS = (PAD, UNK, EOS)  # ids 0, 1, 2 in every vocabulary
PAD_ID, UNK_ID, EOS_ID = range(len(SPECIAL_WORDS))
# Words (with an inner apostrophe: "don't", "o'er") and single punctuation marks, the granularity of the
# tokenised BookCorpus the paper's 20k vocabulary was counted on.
_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
# _TOKEN for tokenizers' regex engine (Oniguruma), whose \w and \s are not Python's: Python's \w is [\p{L}\p{N}_]
# and its \s is Unicode's White_Space with \x1c-\x1f (str.isspace), for every character Python's Unicode database
# knows (tests/run/test_hf_export.py; characters of later Unicode versions, unassigned to Python, may differ)
_TOKEN_FOR_TOKENIZERS = r"[\p{L}\p{N}_]+(?:'[\p{L}\p{N}_]+)*|[^\p{L}\p{N}_\s\x1c-\x1f]"

TRIPLE_SCHEMA = pa.schema([
    pa.field("previous", pa.list_(pa.int32()), nullable=False),
    pa.field("current", pa.list_(pa.int32()), nullable=False),
    pa.field("next", pa.list_(pa.int32()), nullable=False),
])


def tokenize(text: str, chinese_words: str = "jieba") -> list[str]:
    """Lower-cased words and punctuation marks; Chinese words as `chinese_words` segments them
    (data_prep/corpus/chinese.py:
    jieba, or characters)."""
    return _TOKEN.findall(segment_chinese(text, chinese_words).lower())


def count_words(texts: Iterable[str], chinese_words: str = "jieba") -> Counter:
    """Word frequencies of `texts`; per-shard counters add up with `+` to the corpus counts."""
    counts = Counter()
    for text in texts:
        counts.update(tokenize(text, chinese_words))
    return counts


@dataclass(frozen=True)
class WordVocab:
    """Special words first, then words by decreasing frequency. `encode` maps unknown words to <unk>, words as
    `tokenize` splits them with `chinese_words`."""

    words: tuple[str, ...]
    chinese_words: str = "jieba"
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.words[: len(SPECIAL_WORDS)] != SPECIAL_WORDS:
            raise ValueError(f"a word vocabulary must start with {SPECIAL_WORDS}; build it with build_word_vocab")
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.words)})

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(w, UNK_ID) for w in tokenize(text, self.chinese_words)]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text("\n".join(self.words) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike, chinese_words: str = "jieba") -> WordVocab:
        return cls(tuple(Path(path).read_text(encoding="utf-8").splitlines()), chinese_words)


def build_word_vocab(counts: Mapping[str, int], vocab_size: int, min_count: int = 1,
                     chinese_words: str = "jieba") -> WordVocab:
    """The `vocab_size - 3` most frequent words with at least `min_count` occurrences, after <pad> <unk> <eos>.

    Ties are broken alphabetically so that the same counts always give the same ids."""
    if vocab_size <= len(SPECIAL_WORDS):
        raise ValueError(f"skip_thought.vocab_size={vocab_size} leaves no room for words after {SPECIAL_WORDS}; "
                         "use e.g. 20000")
    ranked = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIAL_WORDS),
                    key=lambda w: (-counts[w], w))
    return WordVocab(SPECIAL_WORDS + tuple(ranked[: vocab_size - len(SPECIAL_WORDS)]), chinese_words)


def make_triples(book_sentences: Sequence) -> list[tuple]:
    """(previous, current, next) for every inner sentence of ONE book, in order: n sentences give n - 2 triples.

    Call it once per book; never on sentences concatenated from several books."""
    return [tuple(book_sentences[i - 1: i + 2]) for i in range(1, len(book_sentences) - 1)]


def triples_from_shard(table: pa.Table, vocab: WordVocab,
                       max_words: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Triples of word ids from a sentence shard (rows grouped by book, as data_prep.corpus.shards writes them).

    Sentences are cut to `max_words` words. Kiros et al.'s code drops every triple with a sentence of 30 words or
    more; cutting keeps those triples (long sentences are common in 19th-century books) and bounds T all the same.
    Sentences that tokenize to nothing are left out before triples are formed, so neighbours stay neighbours."""
    books: dict[str, list[list[int]]] = {}
    for book_id, text in zip(table.column("book_id").to_pylist(), table.column("text").to_pylist()):
        ids = vocab.encode(text)[:max_words]
        if ids:
            books.setdefault(book_id, []).append(ids)
    return [triple for sentences in books.values() for triple in make_triples(sentences)]


def write_triples(triples: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]],
                  path: str | os.PathLike) -> None:
    """An uncompressed Arrow IPC file with TRIPLE_SCHEMA (memory-mappable), written atomically."""
    columns = []
    for position, field_ in enumerate(TRIPLE_SCHEMA):
        sentences = [triple[position] for triple in triples]
        offsets = np.zeros(len(sentences) + 1, dtype=np.int32)
        np.cumsum([len(s) for s in sentences], out=offsets[1:])
        values = np.fromiter((w for s in sentences for w in s), dtype=np.int32, count=int(offsets[-1]))
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), type=field_.type))
    table = pa.Table.from_arrays(columns, schema=TRIPLE_SCHEMA)
    with atomic_arrow_file(path, TRIPLE_SCHEMA) as writer:
        writer.write_table(table)


def save_hf_tokenizer(vocab: WordVocab, out_dir: Path, model_max_length: int) -> None:
    """The vocabulary as a tokenizer transformers' AutoTokenizer loads: `encode` and pad_sentences' ids (the words, then
    <eos>); `model_max_length` the longest sentence trained on (skip_thought.max_words and its <eos>), to which
    truncation cuts as triples_from_shard did. One difference from `tokenize` remains: Python lower-cases a word-final
    capital sigma to "ς", tokenizers' Lowercase (character by character) to "σ"."""
    tokenizer = Tokenizer(models.WordLevel(vocab.index, unk_token=UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(_TOKEN_FOR_TOKENIZERS), behavior="removed", invert=True)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, EOS_ID)])
    tokenizer.decoder = decoders.WordPiece(cleanup=False)  # words joined by spaces
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length, "pad_token": PAD,
              "unk_token": UNK, "eos_token": EOS, "split_special_tokens": True}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
