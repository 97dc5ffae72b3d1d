"""Metrics as pure functions of python lists or numpy arrays: the numbers GLUE, CoNLL-2003, SQuAD v1.1 and the
SentEval probes (pipeline/evaluation/senteval.py) report, each a plain float.

Every score is a fraction in [0, 1] (SQuAD's official script prints 100x these). A task's YAML names one entry of
`METRICS`; `score_task` turns predictions and references into a dict of one or more named numbers."""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np


def _check_lengths(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references; "
                         "score exactly one prediction per reference example")
    if len(references) == 0:
        raise ValueError("no examples to score; the split being scored (e.g. dev) is empty")


def accuracy(predictions: Sequence, references: Sequence) -> float:
    _check_lengths(predictions, references)
    return float(np.mean(np.asarray(predictions) == np.asarray(references)))


def binary_f1(predictions: Sequence, references: Sequence, positive=1) -> float:
    """F1 of the `positive` class (GLUE's MRPC/QQP F1); 0.0 when the class is neither predicted nor present."""
    _check_lengths(predictions, references)
    predicted, actual = np.asarray(predictions) == positive, np.asarray(references) == positive
    denominator = int(predicted.sum() + actual.sum())
    return 2 * int((predicted & actual).sum()) / denominator if denominator else 0.0


def matthews_corrcoef(predictions: Sequence, references: Sequence) -> float:
    """Matthews correlation (CoLA's GLUE metric), multiclass form of Gorodkin 2004 as in sklearn; 0.0 when undefined
    (all predictions or all references one class), sklearn's convention."""
    _check_lengths(predictions, references)
    classes = sorted(set(predictions) | set(references), key=str)
    index = {c: i for i, c in enumerate(classes)}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    for p, r in zip(predictions, references):
        confusion[index[r], index[p]] += 1
    true_per_class, pred_per_class = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    covariance = correct * n - true_per_class @ pred_per_class
    denominator = math.sqrt((n * n - pred_per_class @ pred_per_class) * (n * n - true_per_class @ true_per_class))
    return float(covariance / denominator) if denominator else 0.0


def pearson(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Pearson's r (STS-B); NaN when either side is constant, where the correlation is undefined (as scipy)."""
    _check_lengths(predictions, references)
    x, y = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator else math.nan


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span (scipy.stats.rankdata's 'average'):
    [10, 20, 20, 30] -> [1, 2.5, 2.5, 4]."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranks


def spearman(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Spearman's rho (STS-B): Pearson's r of the tie-averaged ranks."""
    _check_lengths(predictions, references)
    return pearson(average_ranks(predictions), average_ranks(references))


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, dash, entity_type = tag.partition("-")
    if not dash or prefix not in ("B", "I") or not entity_type:
        raise ValueError(f"tag {tag!r} is not IOB: use O, B-TYPE or I-TYPE")
    return prefix, entity_type


def entity_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """(type, first, last) token spans of the entities in one IOB1 or IOB2 sentence, delimited as conlleval does:
    an entity starts at B-, or at I- after O or after another type; it ends where the next one starts or at O."""
    spans, current = set(), None  # current: [type, first]
    for position, tag in enumerate(tags):
        prefix, entity_type = _split_tag(tag)
        continues = current is not None and prefix == "I" and entity_type == current[0]
        if current is not None and not continues:
            spans.add((current[0], current[1], position - 1))
            current = None
        if prefix != "O" and not continues:
            current = [entity_type, position]
    if current is not None:
        spans.add((current[0], current[1], len(tags) - 1))
    return spans


def _check_tagged(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> None:
    _check_lengths(predictions, references)
    for i, (predicted_tags, gold_tags) in enumerate(zip(predictions, references)):
        if len(predicted_tags) != len(gold_tags):
            raise ValueError(f"sentence {i}: {len(predicted_tags)} predicted tags for {len(gold_tags)} words; "
                             "predict one tag per word (decode sub-token predictions to words first)")


def _span_scores(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]],
                 spans: Callable[[Sequence[str]], set]) -> dict[str, float]:
    """Micro precision/recall/F1 of the exact `spans` of tagged sentences: a predicted span counts when the reference
    has the same one, over all sentences together."""
    _check_tagged(predictions, references)
    correct = predicted = gold = 0
    for predicted_tags, gold_tags in zip(predictions, references):
        predicted_spans, gold_spans = spans(predicted_tags), spans(gold_tags)
        correct += len(predicted_spans & gold_spans)
        predicted += len(predicted_spans)
        gold += len(gold_spans)
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision/recall/F1 over exact entity spans of tagged sentences (conlleval, CoNLL-2003's metric)."""
    return _span_scores(predictions, references, entity_spans)


def segmentation_words(tags: Sequence[str]) -> set[tuple[int, int]]:
    """(first, last) character spans of the words of one sentence tagged B/M/E/S (word segmentation as character
    tagging, Xue 2003): a word ends at E or S, and at the end of the sentence; the next character starts another. Any
    other sequence is read the same way (B B: two words; M after S: a new word), and a tag outside BMES (a character
    the model never tagged) ends its word as S does."""
    words, start = set(), 0
    for position, tag in enumerate(tags):
        if tag not in ("B", "M") or position == len(tags) - 1 or tags[position + 1] in ("B", "S"):
            words.add((start, position))
            start = position + 1
    return words


def word_f1(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Word-level precision, recall and F1 of a segmentation, as the SIGHAN bakeoff's scorer (score, Emerson 2005)
    computes them: a predicted word is correct when the gold segmentation has a word of the same characters at the same
    place; precision over the predicted words, recall over the gold words, F1 their harmonic mean, over all sentences
    together. Predictions and references are B/M/E/S tags per character."""
    return _span_scores(predictions, references, segmentation_words)


def token_accuracy(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """The fraction of words tagged right over all sentences (POS tagging's metric)."""
    _check_tagged(predictions, references)
    return {"accuracy": accuracy([t for s in predictions for t in s], [t for s in references for t in s])}


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's official normalisation: lower case, drop punctuation, articles and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_exact_match(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_f1(prediction: str, ground_truth: str) -> float:
    """Bag-of-tokens F1 between normalised answers (official evaluate-v1.1.py)."""
    predicted_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    common = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean over questions of the best EM and F1 against any of the question's ground-truth answers."""
    _check_lengths(predictions, references)
    for i, answers in enumerate(references):
        if isinstance(answers, str) or not answers:
            raise ValueError(f"question {i}: references must be a non-empty list of answer strings per question")
    exact = sum(max(squad_exact_match(p, a) for a in answers) for p, answers in zip(predictions, references))
    f1 = sum(max(squad_f1(p, a) for a in answers) for p, answers in zip(predictions, references))
    return {"exact_match": exact / len(references), "f1": f1 / len(references)}


# Task metric name (a task YAML's `metric`) -> function of (predictions, references) giving named numbers. GLUE
# reports MRPC as accuracy and F1 and STS-B as Pearson and Spearman (Wang et al. 2019, Table 1).
def exact_text(text: str, ignore_case: bool = False) -> str:
    """A generated text as exact match compares it: whitespace collapsed (the generated side already is, by
    generation.complete_text) and, where the task's YAML sets exact_match_ignore_case, case folded (ROUGE's tokenizer
    lowercases too). Punctuation and every word are kept, unlike SQuAD's normalize_answer: on a task with one right
    output, such as a date written in a fixed format, "2004-03-01" and "2004 03 01" are different answers."""
    text = " ".join(text.split())
    return text.casefold() if ignore_case else text


def exact_match(predictions: Sequence[str], references: Sequence[str], ignore_case: bool = False) -> float:
    """The share of outputs equal to their reference after exact_text's normalisation."""
    _check_lengths(predictions, references)
    if not references:
        return float("nan")
    return sum(exact_text(p, ignore_case) == exact_text(r, ignore_case)
               for p, r in zip(predictions, references)) / len(references)


def generation_scores(predictions: Sequence[str], references: Sequence[str],
                      ignore_case: bool = False) -> dict[str, float]:
    """A generation task's scores from the libraries the field reports with, not hand-written: ROUGE-1, -2 and -L F1
    (Lin 2004; Google's `rouge-score`, Porter-stemmed as in its summarisation use), the mean over examples, and
    corpus BLEU (Papineni et al. 2002; `sacrebleu`'s default 13a tokenisation, Post 2018), as fractions; then exact
    match (exact_match; `ignore_case`: the task's exact_match_ignore_case), which tells a model that cannot learn a
    task with one right output from one whose outputs are near but never right. Exact match comes last: a task's
    main metric is the first it reports (pipeline/runner.py finetune_objective)."""
    import sacrebleu
    from rouge_score import rouge_scorer

    _check_lengths(predictions, references)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    rouge = [scorer.score(reference, prediction) for prediction, reference in zip(predictions, references)]
    return {**{name: float(np.mean([r[name].fmeasure for r in rouge])) for name in ("rouge1", "rouge2", "rougeL")},
            "bleu": sacrebleu.corpus_bleu(list(predictions), [list(references)]).score / 100,
            "exact_match": exact_match(predictions, references, ignore_case)}


# What the report's figures draw of a task that reports one of these, where a task's others draw its main metric
# (the first it reports): a generation task is read by ROUGE-L (lead-N's N is chosen by it; docs/seq2seq.md's tables
# read it), while ROUGE-1 stays its main metric, the one a sweep maximises (pipeline/runner.py finetune_objective)
FIGURE_METRICS = ("rougeL",)

METRICS: dict[str, Callable[..., dict[str, float]]] = {
    "accuracy": lambda p, r: {"accuracy": accuracy(p, r)},
    "accuracy_f1": lambda p, r: {"accuracy": accuracy(p, r), "f1": binary_f1(p, r)},
    "matthews_corrcoef": lambda p, r: {"matthews_corrcoef": matthews_corrcoef(p, r)},
    "pearson_spearman": lambda p, r: {"pearson": pearson(p, r), "spearman": spearman(p, r)},
    "entity_f1": entity_scores,
    "token_accuracy": token_accuracy,
    "word_f1": word_f1,
    "squad": squad_scores,
    "rouge_bleu": generation_scores,
}


def score_task(metric_name: str, predictions: Sequence, references: Sequence, **options) -> dict[str, float]:
    """The task metric's numbers; `options`: what the task's YAML sets of how it scores (tasks.scoring_options)."""
    if metric_name not in METRICS:
        raise ValueError(f"unknown metric {metric_name!r} in the task YAML; known metrics: {', '.join(METRICS)}")
    return METRICS[metric_name](predictions, references, **options)
