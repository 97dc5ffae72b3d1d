"""Readers for the SentEval-style evaluation tasks (Conneau & Kiela 2018, facebookresearch/SentEval).

Every reader returns tokenised sentences (lists of lowercased tokens), because SentEval hands its encoders
tokenised text: `batcher(batch)` receives `list[list[str]]`. Malformed input raises a ValueError that names the
file and the line, so a broken download can be fixed instead of silently shrinking a task.

    task   files                                     split used for
    -----  ----------------------------------------  -------------------------------------------------
    MR     rt-polarity.pos / rt-polarity.neg          10-fold cross-validation (no official split)
    CR     custrev.pos / custrev.neg, or Hu & Liu's   10-fold cross-validation
           annotated product files
    SUBJ   subj.objective / subj.subjective, or       10-fold cross-validation
           plot.tok.gt9.5000 / quote.tok.gt9.5000
    MPQA   mpqa.pos / mpqa.neg                        10-fold cross-validation
    TREC   train_5500.label, TREC_10.label            train (L2 by inner CV on it) / test
    SICK   SICK.txt (SemEval_set TRAIN/TRIAL/TEST)    train / model selection / test
    MRPC   GLUE train.tsv, dev.tsv                    train (held-out part for model selection) / dev
    TSV    any file with a header, text and label     10-fold cross-validation
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from data_prep.corpus.chinese import segment_chinese

# Penn-Treebank-like splitting, as in the tokenised corpora GloVe and SentEval's tasks use: clitics stay
# whole pieces ("don't" -> "do n't", "he's" -> "he 's"), decimals stay one number, other punctuation is one
# token per character.
_TOKEN = re.compile(r"\w+(?=n't)|n't|'\w+|\d+(?:[.,]\d+)+|\w+|[^\w\s]")


def tokenize(text: str, chinese_words: str = "jieba") -> list[str]:
    """Lowercase and split on whitespace and punctuation: "Don't stop, 2.5 km!" -> do n't stop , 2.5 km !; Chinese
    into the words of `chinese_words` (data_prep/corpus/chinese.py: jieba, or characters): 我爱北京 -> 我 爱 北京"""
    return _TOKEN.findall(segment_chinese(text, chinese_words).lower())


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


def _sentence_lines(path: Path) -> list[list[str]]:
    """The tokenised non-blank lines of a one-sentence-per-line file."""
    sentences = []
    for line_no, line in enumerate(_read_text(path).splitlines(), start=1):
        if "\t" in line:
            # a TSV (a label column beside the text) would otherwise be read as sentences with the label as a word
            raise ValueError(f"{path}:{line_no}: a tab in {line.strip()[:60]!r}; expected one sentence per line, "
                             "no label (a TSV with text and label columns is senteval kind: tsv)")
        if line.strip():
            sentences.append(tokenize(line))
    return sentences


def _labelled_files(files: list[tuple[Path, str]]) -> LabelledSentences:
    """One class per file, (path, class name) in label order, one sentence per line."""
    sentences, labels = [], []
    for label, (path, _) in enumerate(files):
        for sentence in _sentence_lines(path):
            sentences.append(sentence)
            labels.append(label)
    return LabelledSentences(sentences, labels, [name for _, name in files])


def _layout(directory: Path, task: str, layouts: dict[str, list[str]]) -> str:
    """The first layout whose files all exist in `directory`, else an error naming every accepted layout."""
    for name, files in layouts.items():
        if all((directory / f).is_file() for f in files):
            return name
    accepted = "; or ".join(f"{name}: {', '.join(files)}" for name, files in layouts.items())
    raise FileNotFoundError(f"{directory}: no {task} files found; point the {task} task at a directory holding "
                            f"{accepted}")


def read_mr(directory: str | Path) -> LabelledSentences:
    """MR movie-review polarity (Pang & Lee 2005): rt-polarity.pos (label 1) and rt-polarity.neg (label 0),
    one review sentence per line (SentEval's and Cornell's sentence polarity dataset v1.0 alike)."""
    directory = Path(directory)
    _layout(directory, "MR", {"sentence polarity dataset v1.0": ["rt-polarity.neg", "rt-polarity.pos"]})
    return _labelled_files([(directory / "rt-polarity.neg", "negative"), (directory / "rt-polarity.pos", "positive")])


def read_mpqa(directory: str | Path) -> LabelledSentences:
    """MPQA opinion polarity (Wiebe et al. 2005) as SentEval distributes it: mpqa.neg (0) and mpqa.pos (1)."""
    directory = Path(directory)
    _layout(directory, "MPQA", {"SentEval's layout": ["mpqa.neg", "mpqa.pos"]})
    return _labelled_files([(directory / "mpqa.neg", "negative"), (directory / "mpqa.pos", "positive")])


SUBJ_LAYOUTS = {"SentEval's layout": ["subj.objective", "subj.subjective"],
                "Cornell's subjectivity dataset v1.0": ["plot.tok.gt9.5000", "quote.tok.gt9.5000"]}


def read_subj(directory: str | Path) -> LabelledSentences:
    """SUBJ subjectivity (Pang & Lee 2004): objective (0) and subjective (1) sentences, from SentEval's
    subj.{objective,subjective} or Cornell's release, where plot summaries (plot.tok.gt9.5000) are the objective
    and review snippets (quote.tok.gt9.5000) the subjective sentences."""
    directory = Path(directory)
    objective, subjective = SUBJ_LAYOUTS[_layout(directory, "SUBJ", SUBJ_LAYOUTS)]
    return _labelled_files([(directory / objective, "objective"), (directory / subjective, "subjective")])


CR_SENTENCE = re.compile(r"^(?P<tags>[^#]*)##(?P<sentence>.*)$")
# The files as distributed hold lines whose tags and sentence are parted by a single '#' (at least one in the Apex DVD
# player's): read as '##', and counted, where refusing them refused the whole task.
CR_SINGLE_HASH = re.compile(r"^(?P<tags>[^#]*)#(?P<sentence>[^#].*)$")
CR_POLARITY = re.compile(r"\[([+-])\d+\]")
CR_EXPECTED = ("Hu & Liu's annotated review format: '[t]title' lines, 'feature[+n],feature[-n]##sentence' lines, "
               "'*' header lines or blank lines")


def read_cr_annotated(path: Path) -> tuple[list[list[str]], list[int], int]:
    """Sentences and labels (0 negative, 1 positive) of one product file of Hu & Liu 2004, and how many of its lines
    part tags and sentence with a single '#' (CR_SINGLE_HASH): a `##` line is positive when its tags hold a [+n]
    opinion, negative when they hold a [-n], and dropped when they hold neither or both, as SentEval's CR was built;
    `[t]` review titles and the `*` header block are not review sentences."""
    sentences, labels, single_hash = [], [], 0
    for line_no, line in enumerate(_read_text(path).splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("*") or stripped.startswith("[t]"):
            continue
        match = CR_SENTENCE.match(stripped)
        if match is None and (match := CR_SINGLE_HASH.match(stripped)):
            single_hash += 1
        if match is None:
            raise ValueError(f"{path}:{line_no}: {stripped[:60]!r} is not a review line; expected {CR_EXPECTED}")
        signs = set(CR_POLARITY.findall(match["tags"]))
        if len(signs) == 1 and match["sentence"].strip():
            sentences.append(tokenize(match["sentence"]))
            labels.append(int(signs == {"+"}))
    return sentences, labels, single_hash


def read_cr(directory: str | Path) -> LabelledSentences:
    """CR product reviews (Hu & Liu 2004): SentEval's custrev.neg (0) and custrev.pos (1), or else the original
    annotated product files, every *.txt in the directory except its Readme."""
    directory = Path(directory)
    if (directory / "custrev.neg").is_file() or (directory / "custrev.pos").is_file():
        _layout(directory, "CR", {"SentEval's layout": ["custrev.neg", "custrev.pos"]})
        return _labelled_files([(directory / "custrev.neg", "negative"), (directory / "custrev.pos", "positive")])
    products = sorted(p for p in directory.glob("*.txt") if p.stem.lower() != "readme")
    if not products:
        raise FileNotFoundError(f"{directory}: no CR files found; point the CR task at a directory holding SentEval's "
                                "custrev.neg and custrev.pos, or Hu & Liu's annotated product files (*.txt)")
    task = LabelledSentences([], [], ["negative", "positive"])
    single_hash = {}
    for path in products:
        sentences, labels, single_hash[path.name] = read_cr_annotated(path)
        task.sentences += sentences
        task.labels += labels
    if any(single_hash.values()):
        print(f"CR: {sum(single_hash.values())} line(s) part tags and sentence with a single '#', a known quirk of "
              "Hu & Liu's files, read as '##': " + ", ".join(f"{name} ({n})" for name, n in single_hash.items() if n),
              flush=True)
    if len(set(task.labels)) < 2:
        raise ValueError(f"{directory}: the product files hold {len(task.labels)} sentences with a single polarity; "
                         f"expected {CR_EXPECTED}, with [+n] and [-n] opinions")
    return task


TREC_LABELS = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
TREC_LINE = re.compile(r"^(?P<coarse>[A-Z]+):(?P<fine>\S+) (?P<question>.+)$")


def read_trec_file(path: Path) -> LabelledSentences:
    """Questions of one TREC file (Li & Roth 2002), `COARSE:fine question` lines, labelled by the coarse class."""
    task = LabelledSentences([], [], TREC_LABELS)
    for line_no, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        match = TREC_LINE.match(line.strip())
        if match is None or match["coarse"] not in TREC_LABELS:
            raise ValueError(f"{path}:{line_no}: {line.strip()[:60]!r} is not a TREC question line; expected "
                             f"'COARSE:fine question' with COARSE one of {TREC_LABELS}, e.g. 'NUM:date When did ...'")
        task.sentences.append(tokenize(match["question"]))
        task.labels.append(TREC_LABELS.index(match["coarse"]))
    return task


def read_trec(directory: str | Path) -> dict[str, LabelledSentences]:
    """TREC question types (Li & Roth 2002) on its own split: {"train": train_5500.label, "test": TREC_10.label}."""
    directory = Path(directory)
    _layout(directory, "TREC", {"Li & Roth's files": ["train_5500.label", "TREC_10.label"]})
    return {"train": read_trec_file(directory / "train_5500.label"),
            "test": read_trec_file(directory / "TREC_10.label")}


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
