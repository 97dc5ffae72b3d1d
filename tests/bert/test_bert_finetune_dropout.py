"""finetune.dropout: the fine-tuned BERT's dropout rate, set apart from the pretraining recipe's (which has none)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

import pipeline.bert.downstream as bert_downstream
from models.bert import BertConfig, BertForSequenceClassification, BertModel, save_pretrained
from pipeline.downstream.task_data import TaskData
from tests.helpers import tiny_config


class _Context:
    """The two things a fine-tune kind's loader reads: the run's config and its upstream stage directories."""
    def __init__(self, cfg, stage_root: Path):
        self.cfg, self.stage_root = cfg, stage_root

    def stage_dir(self, name: str) -> Path:
        return self.stage_root


@pytest.fixture
def pretrained_dir(tmp_path, monkeypatch) -> Path:
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    save_pretrained(BertModel(config), tmp_path / "stage" / "encoder")
    monkeypatch.setattr(bert_downstream, "load_tokenizer", lambda path: None)  # no tokenizer is read by build()
    return tmp_path / "stage"


def _build(tmp_path: Path, stage_root: Path, kind: str, overrides: list[str]):
    ctx = _Context(tiny_config(tmp_path, overrides), stage_root)
    models = bert_downstream.FINETUNE_KINDS[kind].load(ctx)
    data = TaskData(train=[], dev=[], collate=None, make_module=None, majority_scores=None,
                    make_model=partial(BertForSequenceClassification, num_labels=2, pooling="mean"))
    return models.build(data)


@pytest.mark.parametrize("kind", ["bert", "bert_random"])
def test_finetune_dropout_replaces_the_encoders_rate_for_both_rows(tmp_path, pretrained_dir, kind):
    model = _build(tmp_path, pretrained_dir, kind, ["finetune.dropout=0.1"])
    assert model.encoder.config.hidden_dropout_prob == 0.1
    assert model.encoder.config.attention_probs_dropout_prob == 0.1
    ids = torch.randint(1, 50, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    model.train()
    torch.manual_seed(2)
    first = model(ids, None, mask)[0]
    second = model(ids, None, mask)[0]
    assert not torch.allclose(first, second), "dropout is not active in training mode"


def test_finetune_dropout_keeps_the_pretrained_weights(tmp_path, pretrained_dir):
    model = _build(tmp_path, pretrained_dir, "bert", ["finetune.dropout=0.1"])
    saved = bert_downstream.load_ours_or_hf(pretrained_dir / "encoder").state_dict()
    for name, tensor in model.encoder.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_null_finetune_dropout_keeps_the_encoders_own_rate(tmp_path, pretrained_dir):
    model = _build(tmp_path, pretrained_dir, "bert", ["finetune.dropout=null"])
    assert model.encoder.config.hidden_dropout_prob == 0.0
    model.train()
    ids = torch.randint(1, 50, (4, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(ids, None, torch.ones_like(ids))[0], model(ids, None, torch.ones_like(ids))[0])
