"""The probes' task kinds (`senteval.tasks.<name>.kind`): each a reader, (path, spec) -> data, and an evaluation,
(encoder, data, settings, batch_size, rng) -> metrics, as the table of pipeline/evaluation/senteval.py lays out."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from data_prep.tasks.senteval_data import (
    LabelledSentences,
    SentencePairs,
    read_cr,
    read_labelled_tsv,
    read_mpqa,
    read_mr,
    read_mrpc,
    read_sick,
    read_subj,
    read_trec,
)
from pipeline.engine.family import Encoder
from pipeline.evaluation.classifier_settings import ClassifierSettings
from pipeline.evaluation.embedding import embed
from pipeline.evaluation.metrics import accuracy, binary_f1
from pipeline.evaluation.model_selection import (
    Examples,
    classification_accuracy,
    cross_validated_accuracy,
    fit_selecting_l2,
    inner_validation,
    one_hot,
)
from pipeline.evaluation.pair_features import pair_features
from pipeline.evaluation.relatedness import relatedness_regression


def _embed_pairs(encoder: Encoder, splits: dict[str, SentencePairs], batch_size: int,
                 names: tuple[str, ...]) -> dict[str, np.ndarray]:
    encoder.prepare([s for split in splits.values() for s in (*split.sentences_a, *split.sentences_b)])
    return {name: pair_features(embed(encoder, split.sentences_a, batch_size),
                                embed(encoder, split.sentences_b, batch_size), names)
            for name, split in splits.items()}


def evaluate_single_sentence(encoder: Encoder, data: LabelledSentences, settings: ClassifierSettings,
                             batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    encoder.prepare(data.sentences)
    features = embed(encoder, data.sentences, batch_size)
    return {"accuracy": cross_validated_accuracy(features, np.asarray(data.labels), len(data.label_names),
                                                 settings, rng)}


def _split_classifier(features: dict[str, np.ndarray], labels: dict[str, list[int]], num_classes: int,
                      selection: str, report: str, settings: ClassifierSettings,
                      rng: np.random.Generator) -> np.ndarray:
    """Predicted classes of split `report`, trained on "train", L2 chosen on split `selection` or, when that is
    "train", by inner cross-validation on it (SentEval's KFoldClassifier)."""
    def examples(name):
        truth = np.asarray(labels[name])
        return Examples(features[name], one_hot(truth, num_classes), truth)

    train = examples("train")
    validation = (inner_validation(train, settings.inner_folds, rng) if selection == "train"
                  else [(np.arange(len(train.truth)), examples(selection))])
    model, _ = fit_selecting_l2(train, validation, classification_accuracy, settings)
    return model.predict_proba(features[report]).argmax(1)


def _pair_classifier(features: dict[str, np.ndarray], splits: dict[str, SentencePairs], selection: str,
                     report: str, settings: ClassifierSettings, rng: np.random.Generator) -> np.ndarray:
    return _split_classifier(features, {name: split.labels for name, split in splits.items()},
                             len(splits["train"].label_names), selection, report, settings, rng)


def evaluate_train_test(encoder: Encoder, splits: dict[str, LabelledSentences], settings: ClassifierSettings,
                        batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    """A single-sentence task with its own train/test split (TREC): SentEval trains on train with the L2 strength
    chosen by inner k-fold cross-validation on train, and reports test accuracy."""
    encoder.prepare([s for split in splits.values() for s in split.sentences])
    features = {name: embed(encoder, split.sentences, batch_size) for name, split in splits.items()}
    predicted = _split_classifier(features, {name: split.labels for name, split in splits.items()},
                                  len(splits["train"].label_names), "train", "test", settings, rng)
    return {"accuracy": accuracy(predicted, splits["test"].labels)}


def evaluate_sick_entailment(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                             batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    predicted = _pair_classifier(features, splits, "dev", "test", settings, rng)
    return {"accuracy": accuracy(predicted, splits["test"].labels)}


def evaluate_sick_relatedness(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                              batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    train, dev, test = ((features[name], np.asarray(splits[name].scores)) for name in ("train", "dev", "test"))
    return relatedness_regression(train, dev, test, settings)


def evaluate_mrpc(encoder: Encoder, splits: dict[str, SentencePairs], settings: ClassifierSettings,
                  batch_size: int, rng: np.random.Generator) -> dict[str, float]:
    features = _embed_pairs(encoder, splits, batch_size, settings.pair_features)
    predicted = _pair_classifier(features, splits, "train", "dev", settings, rng)
    labels = splits["dev"].labels
    return {"accuracy": accuracy(predicted, labels), "f1": binary_f1(predicted, labels)}


def _read_tsv_task(path: Path, spec: Mapping) -> LabelledSentences:
    names = spec.get("label_names")
    return read_labelled_tsv(path, spec["text_column"], spec["label_column"],
                             [str(n) for n in names] if names is not None else None)


TASK_KINDS: dict[str, tuple[Callable, Callable]] = {
    "mr": (lambda path, spec: read_mr(path), evaluate_single_sentence),
    "cr": (lambda path, spec: read_cr(path), evaluate_single_sentence),
    "subj": (lambda path, spec: read_subj(path), evaluate_single_sentence),
    "mpqa": (lambda path, spec: read_mpqa(path), evaluate_single_sentence),
    "trec": (lambda path, spec: read_trec(path), evaluate_train_test),
    "tsv": (_read_tsv_task, evaluate_single_sentence),
    "sick_entailment": (lambda path, spec: read_sick(path), evaluate_sick_entailment),
    "sick_relatedness": (lambda path, spec: read_sick(path), evaluate_sick_relatedness),
    "mrpc": (lambda path, spec: read_mrpc(path), evaluate_mrpc),
}


PAIR_KINDS = frozenset({"sick_entailment", "sick_relatedness", "mrpc"})  # the kinds scored on pair_features
