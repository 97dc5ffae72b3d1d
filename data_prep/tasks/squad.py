"""SQuAD v1.1 (Rajpurkar et al. 2016) for extractive QA with BERT (Devlin et al. 2019, Sec. 4.2): reading the
official JSON, cutting long contexts into overlapping windows, and decoding the best answer span back to text."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_prep.tasks.encoding import not_utf8

CLS_INDEX = 0  # start = end = [CLS] marks "the answer is not in this window" (BERT's run_squad.py)


@dataclass
class SquadExample:
    qas_id: str
    question: str
    context: str
    answers: list[str]  # every ground truth; training uses the first
    answer_starts: list[int]  # character offsets into context


def _checked_example(path: Path, qa: dict, context: str) -> SquadExample:
    answers = [a["text"] for a in qa["answers"]]
    starts = [a["answer_start"] for a in qa["answers"]]
    if not answers:
        raise ValueError(f"{path}: question {qa['id']} has no answers; SQuAD v1.1 questions all have one "
                         "(v2.0's unanswerable questions are not supported)")
    for text, start in zip(answers, starts):
        found = context[start:start + len(text)]
        if found != text:
            raise ValueError(f"{path}: question {qa['id']}: answer {text!r} is not at answer_start {start} of its "
                             f"context (found {found!r}); fix answer_start in the file")
    return SquadExample(qa["id"], qa["question"], context, answers, starts)


def read_squad(path: str | Path) -> list[SquadExample]:
    """Questions of an official SQuAD v1.1 file (data -> paragraphs -> qas -> answers), each answer checked against
    its context."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass the directory holding the SQuAD JSON files as "
                                "finetune.data_dir")
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark, as an editor on Windows writes, is no error
            articles = json.load(f)["data"]
        examples = [_checked_example(path, qa, paragraph["context"])
                    for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    except UnicodeDecodeError as error:
        raise not_utf8(path, error) from None
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a SQuAD v1.1 JSON file ({type(error).__name__}: {error}); expected "
                         "data -> paragraphs -> context, qas -> id, question, answers -> text, answer_start") \
            from error
    if not examples:
        raise ValueError(f"{path}: no questions in the file")
    return examples


def _truncated_question(tokenizer: Tokenizer, question: str, max_query_length: int) -> str:
    encoding = tokenizer.encode(question, add_special_tokens=False)
    if len(encoding.ids) <= max_query_length:
        return question
    return question[:encoding.offsets[max_query_length - 1][1]]


def _answer_token_span(offsets: Sequence[tuple[int, int]], context_tokens: range, start_char: int,
                       end_char: int) -> tuple[int, int]:
    """Token positions of the answer's first and last sub-token in one window, or CLS_INDEX twice when the window
    does not hold the whole answer."""
    first, last = context_tokens[0], context_tokens[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return CLS_INDEX, CLS_INDEX
    start = max(i for i in context_tokens if offsets[i][0] <= start_char)
    end = min(i for i in context_tokens if offsets[i][1] >= end_char)
    return start, end


def squad_features(tokenizer: Tokenizer, examples: Sequence[SquadExample], max_seq_length: int, doc_stride: int,
                   max_query_length: int) -> list[dict]:
    """[CLS] question [SEP] context window [SEP] features. Windows start every `doc_stride` context tokens, as in
    BERT's run_squad.py (HF tokenizers' `stride` is the overlap instead, converted here). Each feature keeps its
    `example_index` and the character `offsets` of its context tokens (None elsewhere) for decoding."""
    previous_truncation = tokenizer.truncation
    features = []
    try:
        for example_index, example in enumerate(examples):
            question = _truncated_question(tokenizer, example.question, max_query_length)
            question_length = len(tokenizer.encode(question, add_special_tokens=False).ids)
            window = max_seq_length - question_length - 3  # [CLS], [SEP], [SEP]
            if not 0 < doc_stride <= window:
                raise ValueError(f"doc_stride {doc_stride} must be in 1..{window}, the context tokens that fit in "
                                 f"max_seq_length {max_seq_length} beside a {question_length}-token question; "
                                 "lower doc_stride or max_query_length, or raise max_seq_length")
            tokenizer.enable_truncation(max_length=max_seq_length, stride=window - doc_stride,
                                        strategy="only_second")
            encoding = tokenizer.encode(question, example.context)
            start_char = example.answer_starts[0]
            end_char = start_char + len(example.answers[0])
            for window_encoding in [encoding, *encoding.overflowing]:
                sequence_ids = window_encoding.sequence_ids
                context_positions = [i for i, s in enumerate(sequence_ids) if s == 1]
                if not context_positions:
                    continue
                context_tokens = range(context_positions[0], context_positions[-1] + 1)
                start, end = _answer_token_span(window_encoding.offsets, context_tokens, start_char, end_char)
                features.append({
                    "input_ids": np.asarray(window_encoding.ids, dtype=np.int64),
                    "token_type_ids": np.asarray(window_encoding.type_ids, dtype=np.int64),
                    "start_position": start, "end_position": end, "example_index": example_index,
                    "offsets": [tuple(o) if s == 1 else None
                                for o, s in zip(window_encoding.offsets, sequence_ids)],
                })
    finally:
        if previous_truncation is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(**previous_truncation)
    return features


def best_answers(examples: Sequence[SquadExample], features: Sequence[dict],
                 start_logits: Mapping[int, np.ndarray], end_logits: Mapping[int, np.ndarray], n_best_size: int,
                 max_answer_length: int) -> dict[str, str]:
    """qas_id -> answer text: over every window of the question, the context span maximising start + end logit
    among the n_best_size best starts and ends, with end >= start and at most max_answer_length tokens (BERT's
    run_squad.py). Logits are keyed by feature index; questions with no scored window are left out."""
    best: dict[int, tuple[float, str]] = {}
    for feature_index, feature in enumerate(features):
        if feature_index not in start_logits:
            continue
        offsets, context = feature["offsets"], examples[feature["example_index"]].context
        starts, ends = np.asarray(start_logits[feature_index]), np.asarray(end_logits[feature_index])
        best.setdefault(feature["example_index"], (-np.inf, ""))
        for start in np.argsort(starts)[::-1][:n_best_size]:
            for end in np.argsort(ends)[::-1][:n_best_size]:
                if (start >= len(offsets) or end >= len(offsets) or offsets[start] is None or offsets[end] is None
                        or end < start or end - start + 1 > max_answer_length):
                    continue
                score = float(starts[start] + ends[end])
                if score > best[feature["example_index"]][0]:
                    best[feature["example_index"]] = (score, context[offsets[start][0]:offsets[end][1]])
    return {examples[i].qas_id: text for i, (_, text) in best.items()}
