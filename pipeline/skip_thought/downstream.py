"""Skip-Thought vectors on the fine-tune stage's tasks as Kiros et al. §3 use them: the encoder frozen, a linear model
(`models.skip_thought.SkipThoughtClassifier`) trained on its sentence vectors, pairs read as [|u - v|, u * v] (the
probes' default pair features, pipeline/evaluation/pair_features.py).
`finetune.models` takes every encoder the evaluate stage offers (uni-skip `skip_thought`, `skip_thought_bi`,
`skip_thought_combine`, their `_expanded` vocabularies and their `_random` twins), so that GLUE-style tables get the
paper's rows beside BERT's and ELMo's."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from models.skip_thought import SkipThoughtClassifier
from pipeline.downstream.modules import ClassificationModule, RegressionModule
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.task_data import TaskData, tsv_splits
from pipeline.downstream.tasks import TaskSplit
from pipeline.engine.dag import StageContext
from pipeline.engine.family import EncoderSpec, FinetuneKind
from pipeline.evaluation.pair_features import pair_features
from pipeline.skip_thought.encoder import ENCODERS, SkipThoughtSentenceEncoder

ENCODE_BATCH = 256  # sentences per forward pass of the frozen encoder


@dataclass
class SkipThoughtTaskModels:
    """One frozen Skip-Thought encoder: a task's sentences are encoded once, and each (size, seed) trains a fresh
    linear model on their vectors."""
    encoder: SkipThoughtSentenceEncoder
    encoding_key: str

    def vectors(self, texts: list[str]) -> np.ndarray:
        """(N, D) float32 vectors of raw sentences, in the words the encoder's vocabulary splits them into."""
        return np.concatenate([self.encoder.batcher([t.split() for t in texts[i:i + ENCODE_BATCH]])
                               for i in range(0, len(texts), ENCODE_BATCH)]).astype(np.float32)

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


def _finetune_kind(name: str, spec: EncoderSpec) -> FinetuneKind:
    def load(ctx: StageContext) -> SkipThoughtTaskModels:
        return SkipThoughtTaskModels(spec.build(ctx), name)
    return FinetuneKind(spec.upstream, load, random_twin=spec.random_twin)


FINETUNE_KINDS = {name: _finetune_kind(name, spec) for name, spec in ENCODERS.items()}
