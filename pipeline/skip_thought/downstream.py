"""Skip-Thought vectors on the fine-tune stage's tasks as Kiros et al. §3 use them: the encoder frozen, a linear model
(`models.skip_thought.SkipThoughtClassifier`) trained on its sentence vectors, pairs read as [|u - v|, u * v] (the
probes' default pair features, pipeline/evaluation/pair_features.py).
`finetune.models` takes every encoder the evaluate stage offers (uni-skip `skip_thought`, `skip_thought_bi`,
`skip_thought_combine`, their `_expanded` vocabularies, their `_random` twins and their `_w2v` controls), so that
GLUE-style tables get the paper's rows beside BERT's and ELMo's; and `skip_thought_words`, uni-skip's vector beside the
mean of the sentence's word2vec vectors (the w2v_mean baseline's features), under the same linear model."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from data_prep.corpus.word_vectors import WordVectors
from models.skip_thought import SkipThoughtClassifier
from pipeline.data_settings import chinese_words_of
from pipeline.downstream.baselines import mean_word_vectors
from pipeline.downstream.modules import ClassificationModule, RegressionModule
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.task_data import TaskData, tsv_splits
from pipeline.downstream.tasks import TaskSplit
from pipeline.downstream.word2vec import WORD2VEC, load_word2vec
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec, FinetuneKind
from pipeline.evaluation.pair_features import pair_features
from pipeline.skip_thought.encoder import ENCODERS, SkipThoughtSentenceEncoder
from pipeline.skip_thought.pretrain import starts_from_word2vec

ENCODE_BATCH = 256  # sentences per forward pass of the frozen encoder


@dataclass
class SkipThoughtTaskModels:
    """One frozen Skip-Thought encoder: a task's sentences are encoded once, and each (size, seed) trains a fresh
    linear model on their vectors; with `word_vectors`, on each vector followed by the mean of the sentence's word
    vectors, as w2v_mean computes it (words split by `chinese_words`, the word2vec stage's)."""
    encoder: SkipThoughtSentenceEncoder
    encoding_key: str
    word_vectors: WordVectors | None = None
    chinese_words: str = "jieba"

    def vectors(self, texts: list[str]) -> np.ndarray:
        """(N, D) float32 vectors of raw sentences, in the words the encoder's vocabulary splits them into; (N, D + d)
        with the word vectors' mean (d) after them."""
        sentence_vectors = np.concatenate([self.encoder.batcher([t.split() for t in texts[i:i + ENCODE_BATCH]])
                                           for i in range(0, len(texts), ENCODE_BATCH)]).astype(np.float32)
        if self.word_vectors is None:
            return sentence_vectors
        return np.concatenate([sentence_vectors, mean_word_vectors(texts, self.word_vectors, self.chinese_words)],
                              axis=1)

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        if task.format != "tsv":
            raise ValueError(f"task {task.name}: Skip-Thought vectors are sentence vectors (Kiros et al. §3), for tsv "
                             f"tasks (classification, pairs, regression), not {task.format!r}; drop "
                             f"{self.encoding_key} from finetune.models for it")
        train, dev, majority_scores = tsv_splits(task, data_dir, finetune.max_train_examples, seed, selection_fraction)
        pair, regression = train.texts_b is not None, task.labels is None

        def features(split: TaskSplit) -> np.ndarray:  # (N, D), or (N, 2D) for pairs
            u = self.vectors(split.texts_a)
            return pair_features(u, self.vectors(split.texts_b)) if pair else u

        def rows(split: TaskSplit, x: np.ndarray) -> list[dict]:
            return [{"features": x[i], "label": split.labels[i]} for i in range(len(split.labels))]

        train_features = features(train)
        outputs = 1 if regression else len(task.labels)
        # standardised with the whole train split's features (no labels read), so that every (size, seed) subset
        # is scaled alike
        mean = torch.from_numpy(train_features.mean(0))
        scale = torch.from_numpy(train_features.std(0, ddof=1)).clamp(min=1e-6)

        def make_model(_) -> SkipThoughtClassifier:
            model = SkipThoughtClassifier(train_features.shape[1], outputs)
            model.mean.copy_(mean)
            model.scale.copy_(scale)
            return model

        module = RegressionModule if regression else partial(ClassificationModule, metric=task.metric)
        return TaskData(rows(train, train_features), rows(dev, features(dev)), collate_features, make_model, module,
                        majority_scores, None if regression else train.labels)

    def build(self, data: TaskData) -> nn.Module:
        return data.make_model(None)


def collate_features(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Rows {"features", "label"} -> {"features": (B, F), "labels": (B,)}, float labels for a score."""
    dtype = torch.float32 if isinstance(rows[0]["label"], float) else torch.long
    return {"features": torch.from_numpy(np.stack([r["features"] for r in rows])),
            "labels": torch.tensor([r["label"] for r in rows], dtype=dtype)}


def _control_of(name: str):
    """The control (FinetuneKind.control) of the pretrained kind `name`: its `_w2v` kind where its pretraining starts
    from the word2vec vectors, else its random twin (the same architecture from the same random start)."""
    return lambda cfg: f"{name}_w2v" if starts_from_word2vec(cfg) else f"{name}_random"


def _finetune_kind(name: str, spec: EncoderSpec) -> FinetuneKind:
    def load(ctx: StageContext) -> SkipThoughtTaskModels:
        return SkipThoughtTaskModels(spec.build(ctx), name)
    pretrained = spec.random_twin is not None
    control_of = name.removesuffix("_w2v") if name.endswith("_w2v") else None
    return FinetuneKind(spec.upstream, load, random_twin=spec.random_twin,
                        control=_control_of(name) if pretrained else lambda cfg: None, control_of=control_of)


# uni-skip's vector with the word2vec mean beside it: where the vectors fall short of w2v_mean, what they add to it
WITH_WORDS = "skip_thought_words"


def _with_words(ctx: StageContext) -> SkipThoughtTaskModels:
    return SkipThoughtTaskModels(ENCODERS["skip_thought"].build(ctx), WITH_WORDS,
                                 load_word2vec(ctx.stage_dir(WORD2VEC.name)), chinese_words_of(ctx.cfg))


FINETUNE_KINDS = {**{name: _finetune_kind(name, spec) for name, spec in ENCODERS.items()},
                  WITH_WORDS: FinetuneKind(lambda cfg: (*ENCODERS["skip_thought"].upstream(cfg), WORD2VEC.name),
                                           _with_words)}
