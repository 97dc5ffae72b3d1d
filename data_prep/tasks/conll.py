"""CoNLL-format tagging data (CoNLL-2003 NER, Tjong Kim Sang & De Meulder 2003; CoNLL-2000 chunking, Tjong Kim Sang
& Buchholz 2000; POS tags): reading any word and tag column, IOB1 -> IOB2, and the mapping between word-level tags and
WordPiece sub-tokens for a token classifier (BERT paper, Sec. 5.3: the first sub-token of each word carries its
label, the other sub-tokens are not predicted)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from conventions import IGNORE_INDEX
from data_prep.tasks.encoding import not_utf8

DOCSTART = "-DOCSTART-"


@dataclass
class TaggedSentence:
    tokens: list[str]
    tags: list[str]


def _check_tag(tag: str, path: Path, line_no: int) -> None:
    prefix, dash, entity_type = tag.partition("-")
    if tag != "O" and not (dash and prefix in ("B", "I") and entity_type):
        raise ValueError(f"{path}:{line_no}: tag {tag!r} is not IOB; the tag column must hold O, B-TYPE or I-TYPE "
                         "(a task whose tags are not chunks, e.g. POS tags, sets tag_scheme: none)")


def read_conll(path: str | Path, labels: Sequence[str] | None = None, word_column: int = 0, tag_column: int = -1,
               iob: bool = True) -> list[TaggedSentence]:
    """Sentences of a CoNLL file: one word per line, space-separated columns (CoNLL-2003: word POS chunk NER;
    CoNLL-2000: word POS chunk), the word in `word_column` and the tag in `tag_column` (0-based, negative from the
    end), a blank line between sentences; `-DOCSTART-` lines mark documents and are dropped. With `iob` every tag
    must be O, B-TYPE or I-TYPE. With `labels` (a task's tag set), any other tag is an error naming its line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass the directory holding the CoNLL files as finetune.data_dir")
    needed = max(word_column, tag_column, -word_column - 1, -tag_column - 1) + 1
    sentences, tokens, tags, num_columns = [], [], [], None
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # only line breaks: splitlines() also splits at \x1c
    except UnicodeDecodeError as error:
        raise not_utf8(path, error) from None
    for line_no, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields or fields[0] == DOCSTART:
            if tokens:
                sentences.append(TaggedSentence(tokens, tags))
            tokens, tags = [], []
            continue
        if num_columns is None:
            num_columns = len(fields)
        if len(fields) != num_columns or num_columns < max(2, needed):
            raise ValueError(f"{path}:{line_no}: expected {max(2, needed, num_columns)} space-separated columns "
                             f"(the word in column {word_column} and the tag in column {tag_column}, counting "
                             f"from 0, as on the file's first word line), got {len(fields)}: {line!r}")
        tag = fields[tag_column]
        if iob:
            _check_tag(tag, path, line_no)
        if labels is not None and tag not in labels:
            raise ValueError(f"{path}:{line_no}: tag {tag!r} is not one of the task's labels "
                             f"{list(labels)}; fix the file, or add the tag to the task YAML's labels")
        tokens.append(fields[word_column])
        tags.append(tag)
    if tokens:
        sentences.append(TaggedSentence(tokens, tags))
    if not sentences:
        raise ValueError(f"{path}: no tagged words; expected CoNLL lines 'word ... TAG' separated by blank lines")
    return sentences


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (CoNLL-2003's files: B- only between adjacent entities of one type) -> IOB2 (every entity opens with B-),
    so the classifier sees one consistent 'begin' label. IOB2 input comes back unchanged."""
    converted = []
    for i, tag in enumerate(tags):
        if tag.startswith("I-"):
            previous = converted[i - 1] if i else "O"
            if previous == "O" or previous[2:] != tag[2:]:
                tag = "B-" + tag[2:]
        converted.append(tag)
    return converted


def label_set(sentences: Sequence[TaggedSentence]) -> list[str]:
    """The tags used in `sentences`: O first, then by entity type, B- before I-."""
    tags = {tag for s in sentences for tag in s.tags} - {"O"}
    return ["O", *sorted(tags, key=lambda t: (t[2:], t[:1]))]


def encode_tagged_sentences(tokenizer: Tokenizer, sentences: Sequence[TaggedSentence], labels: Sequence[str],
                            max_seq_length: int) -> list[dict]:
    """One feature per sentence: [CLS] sub-tokens [SEP] cut to max_seq_length, `labels` the tag id on each word's
    first sub-token and IGNORE_INDEX elsewhere, `word_ids` the word index of each sub-token (-1 for [CLS]/[SEP])."""
    label_to_id = {label: i for i, label in enumerate(labels)}
    unknown = sorted({tag for s in sentences for tag in s.tags} - set(label_to_id))
    if unknown:
        raise ValueError(f"tags {unknown} are not in the task's labels {list(labels)}; add them to the task YAML")
    previous_truncation = tokenizer.truncation
    tokenizer.enable_truncation(max_length=max_seq_length)
    try:
        encodings = tokenizer.encode_batch([s.tokens for s in sentences], is_pretokenized=True)
    finally:
        if previous_truncation is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(**previous_truncation)
    features = []
    for index, (sentence, encoding) in enumerate(zip(sentences, encodings)):
        word_ids = [-1 if w is None else w for w in encoding.word_ids]
        token_labels = [IGNORE_INDEX] * len(word_ids)
        for position, word in enumerate(word_ids):
            if word >= 0 and (position == 0 or word_ids[position - 1] != word):
                token_labels[position] = label_to_id[sentence.tags[word]]
        features.append({"input_ids": np.asarray(encoding.ids, dtype=np.int64),
                         "token_type_ids": np.asarray(encoding.type_ids, dtype=np.int64),
                         "labels": np.asarray(token_labels, dtype=np.int64),
                         "word_ids": np.asarray(word_ids, dtype=np.int64),
                         "example_index": index})
    return features


def word_level_tags(token_predictions: Sequence[int], word_ids: Sequence[int], labels: Sequence[str],
                    num_words: int) -> list[str]:
    """Invert encode_tagged_sentences for predictions: each word takes the prediction on its first sub-token. Words
    with no sub-token (cut by max_seq_length, or emptied by normalisation) get O, so that scores are always against
    every gold word."""
    tags = ["O"] * num_words
    seen = set()
    for prediction, word in zip(token_predictions, word_ids):
        if word >= 0 and word not in seen:
            seen.add(word)
            tags[word] = labels[int(prediction)]
    return tags
