"""Readers for the SentEval-style evaluation tasks (Conneau & Kiela 2018, facebookresearch/SentEval).

Every reader returns tokenised sentences (lists of lowercased tokens), because SentEval hands its encoders
tokenised text: `batcher(batch)` receives `list[list[str]]`. Malformed input raises a ValueError that names the
file and the line, so a broken download can be fixed instead of silently shrinking a task.

    task   files                                     split used for
    -----  ----------------------------------------  -------------------------------------------------
    MR     rt-polarity.pos / rt-polarity.neg          10-fold cross-validation (no official split)
    SICK   SICK.txt (SemEval_set TRAIN/TRIAL/TEST)    train / model selection / test
    MRPC   GLUE train.tsv, dev.tsv                    train (held-out part for model selection) / dev
    TSV    any file with a header, text and label     10-fold cross-validation
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

# Penn-Treebank-like splitting, as in the tokenised corpora GloVe and SentEval's tasks use: clitics stay
# whole pieces ("don't" -> "do n't", "he's" -> "he 's"), decimals stay one number, other punctuation is one
# token per character.
_TOKEN = re.compile(r"\w+(?=n't)|n't|'\w+|\d+(?:[.,]\d+)+|\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercase and split on whitespace and punctuation: "Don't stop, 2.5 km!" -> do n't stop , 2.5 km !"""
    return _TOKEN.findall(text.lower())


@dataclass
class LabelledSentences:
    """A single-sentence classification task: labels index into label_names."""
    sentences: list[list[str]]
    labels: list[int]
    label_names: list[str]


@dataclass
class SentencePairs:
    """One split of a sentence-pair task: labels index into label_names; scores is SICK's 1-5 relatedness."""
    sentences_a: list[list[str]]
    sentences_b: list[list[str]]
    labels: list[int]
    label_names: list[str]
    scores: list[float] | None = None


def _read_text(path: Path) -> str:
    # The Cornell release of MR is ISO-8859-1; copies converted to UTF-8 also circulate (SentEval's own download
    # is one). Strict UTF-8 first, so a converted file is never double-decoded, else latin-1, which cannot fail.
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {what}")
    return path


def read_mr(directory: str | Path) -> LabelledSentences:
    """MR movie-review polarity (Pang & Lee 2005): rt-polarity.pos (label 1) and rt-polarity.neg (label 0),
    one review sentence per line. Blank lines are skipped."""
    directory = Path(directory)
    sentences, labels = [], []
    for label, name in ((0, "rt-polarity.neg"), (1, "rt-polarity.pos")):
        path = _require_file(directory / name, "point the MR task at the directory of rt-polarity.pos/.neg "
                                               "(sentence polarity dataset v1.0)")
        for line in _read_text(path).splitlines():
            if line.strip():
                sentences.append(tokenize(line))
                labels.append(label)
    return LabelledSentences(sentences, labels, ["negative", "positive"])


def _tsv_rows(path: Path, required: list[str], encoding: str = "utf-8-sig"):
    """(line number, row dict) of a headed TSV with QUOTE_NONE: GLUE and SICK sentences contain bare quote marks."""
    with open(path, encoding=encoding, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = [column.strip() for column in next(reader, [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"{path}:1: header {header} lacks column(s) {missing}")
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ValueError(f"{path}:{reader.line_num}: expected {len(header)} tab-separated fields "
                                 f"({', '.join(header)}), found {len(row)}")
            yield reader.line_num, dict(zip(header, (cell.strip() for cell in row)))


SICK_SPLITS = {"TRAIN": "train", "TRIAL": "dev", "TEST": "test"}
SICK_ENTAILMENT_LABELS = ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"]


def read_sick(path: str | Path) -> dict[str, SentencePairs]:
    """SICK (Marelli et al. 2014, SemEval-2014 Task 1) from the full SICK.txt release: {"train", "dev", "test"}
    from the SemEval_set column (TRAIN / TRIAL / TEST), with entailment labels and relatedness scores in [1, 5]."""
    path = _require_file(Path(path), "point the SICK tasks at SICK.txt (the full release with a SemEval_set column)")
    columns = ["sentence_A", "sentence_B", "entailment_label", "relatedness_score", "SemEval_set"]
    splits = {name: SentencePairs([], [], [], SICK_ENTAILMENT_LABELS, []) for name in SICK_SPLITS.values()}
    for line, row in _tsv_rows(path, columns):
        if row["SemEval_set"] not in SICK_SPLITS:
            raise ValueError(f"{path}:{line}: SemEval_set {row['SemEval_set']!r} is not one of {list(SICK_SPLITS)}")
        if row["entailment_label"] not in SICK_ENTAILMENT_LABELS:
            raise ValueError(f"{path}:{line}: entailment_label {row['entailment_label']!r} is not one of "
                             f"{SICK_ENTAILMENT_LABELS}")
        try:
            score = float(row["relatedness_score"])
        except ValueError:
            score = float("nan")
        if not 1.0 <= score <= 5.0:
            raise ValueError(f"{path}:{line}: relatedness_score {row['relatedness_score']!r} is not a number in [1, 5]")
        split = splits[SICK_SPLITS[row["SemEval_set"]]]
        split.sentences_a.append(tokenize(row["sentence_A"]))
        split.sentences_b.append(tokenize(row["sentence_B"]))
        split.labels.append(SICK_ENTAILMENT_LABELS.index(row["entailment_label"]))
        split.scores.append(score)
    return splits


def read_mrpc(directory: str | Path) -> dict[str, SentencePairs]:
    """MRPC (Dolan & Brockett 2005) in the GLUE layout: {"train", "dev"} from train.tsv and dev.tsv, label 1 =
    paraphrase (the Quality column). GLUE's test.tsv has no labels, so dev is the reported split."""
    directory = Path(directory)
    splits = {}
    for split in ("train", "dev"):
        path = _require_file(directory / f"{split}.tsv", "point the MRPC task at a GLUE MRPC directory "
                                                         "with train.tsv and dev.tsv")
        pairs = SentencePairs([], [], [], ["not_paraphrase", "paraphrase"])
        for line, row in _tsv_rows(path, ["Quality", "#1 String", "#2 String"]):
            if row["Quality"] not in ("0", "1"):
                raise ValueError(f"{path}:{line}: Quality {row['Quality']!r} is not 0 or 1")
            pairs.sentences_a.append(tokenize(row["#1 String"]))
            pairs.sentences_b.append(tokenize(row["#2 String"]))
            pairs.labels.append(int(row["Quality"]))
        splits[split] = pairs
    return splits


def read_labelled_tsv(path: str | Path, text_column: str, label_column: str,
                      label_names: list[str] | None = None) -> LabelledSentences:
    """Any headed TSV with a text column and a label column. Labels index into `label_names` when given (a label
    outside it is an error), otherwise into the sorted distinct labels of the file."""
    path = _require_file(Path(path), f"the labelled TSV needs columns {text_column!r} and {label_column!r}")
    rows = list(_tsv_rows(path, [text_column, label_column]))
    names = list(label_names) if label_names is not None else sorted({row[label_column] for _, row in rows})
    index = {name: i for i, name in enumerate(names)}
    sentences, labels = [], []
    for line, row in rows:
        if row[label_column] not in index:
            raise ValueError(f"{path}:{line}: label {row[label_column]!r} is not one of {names}")
        sentences.append(tokenize(row[text_column]))
        labels.append(index[row[label_column]])
    if len(names) < 2:
        raise ValueError(f"{path}: column {label_column!r} has fewer than two labels ({names}); nothing to classify")
    return LabelledSentences(sentences, labels, names)
