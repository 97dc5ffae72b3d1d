"""Masked LM + a contrastive loss between the two segments of each sentence pair (pretrain.contrastive_weight)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.bert import BertConfig, BertForPreTraining
from pipeline.bert.data import BertPretrainingCollator, segment_apart
from pipeline.bert.module import contrastive_pretraining_losses
from pipeline.runner import validate
from tests.helpers import TinyRun, tiny_config

PAD, CLS, SEP, MASK = 0, 1, 2, 3
CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=32)


def _pair(first: list[int], second: list[int], is_random_next: int) -> dict:
    ids = [CLS, *first, SEP, *second, SEP]
    return {"input_ids": np.array(ids), "token_type_ids": np.array([0] * (len(first) + 2) + [1] * (len(second) + 1)),
            "next_sentence_label": is_random_next}  # HF's convention: 0 = B continues A


def _collator(**kwargs) -> BertPretrainingCollator:
    return BertPretrainingCollator(PAD, MASK, CONFIG.vocab_size, [CLS, SEP, MASK], split_segments=True,
                                   generator=torch.Generator().manual_seed(0), **kwargs)


def test_each_pair_becomes_its_two_segments_each_under_its_own_cls():
    row = _pair([10, 11, 12], [20, 21], 0)
    assert segment_apart(row, 0)["input_ids"].tolist() == [CLS, 10, 11, 12, SEP]
    assert segment_apart(row, 1)["input_ids"].tolist() == [CLS, 20, 21, SEP]
    batch = _collator()([row, _pair([13], [22, 23, 24, 25], 1)])
    # rows: both first segments, then both second segments; one next-sentence label per pair
    assert batch["attention_mask"].sum(1).tolist() == [5, 3, 4, 6]
    assert batch["next_sentence_label"].tolist() == [0, 1]
    assert not batch["token_type_ids"].any()
    with pytest.raises(ValueError, match="examples.packing=sentence_pairs"):
        segment_apart({"input_ids": np.array([CLS, 10, SEP]), "token_type_ids": np.zeros(3, int)}, 0)


def test_a_second_segment_equal_to_its_first_is_found_among_the_batch():
    torch.manual_seed(0)
    model = BertForPreTraining(CONFIG).eval()
    g = torch.Generator().manual_seed(1)
    segments = [torch.randint(10, 64, (6,), generator=g).tolist() for _ in range(8)]

    def batch(rows):  # each second segment masked as its first, so equal segments are equal inputs
        masked = _collator()(rows)
        masked["input_ids"][len(rows):] = masked["input_ids"][:len(rows)]
        return masked

    out = contrastive_pretraining_losses(model, batch([_pair(s, s, 0) for s in segments]), 1.0, 0.05)
    assert out["contrastive_acc"] == 1.0
    assert torch.isclose(out["loss"], out["mlm_loss"] + out["contrastive_loss"])
    # a random pair is a negative only: swapping its second segment for another row's costs nothing
    rows = [_pair(s, s, 0) for s in segments]
    rows[0]["next_sentence_label"] = 1
    masked = batch(rows)
    masked["input_ids"][len(rows)] = masked["input_ids"][1]
    out = contrastive_pretraining_losses(model, masked, 1.0, 0.05)
    assert out["contrastive_acc"] < 1.0  # row 1's own second segment now has a twin in row 0's place


def test_the_segments_of_one_document_learn_to_find_each_other():
    """Documents drawn from disjoint pools of tokens: after a few dozen steps a first segment picks its own second
    segment among 12 far more often than 1 in 12."""
    torch.manual_seed(0)
    model = BertForPreTraining(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = np.random.default_rng(0)
    collator = _collator()

    def batch():
        topics = g.permutation(12)  # one document (and pool of 4 tokens) per pair
        rows = [_pair(list(g.choice(np.arange(4) + 10 + 4 * t, 6)), list(g.choice(np.arange(4) + 10 + 4 * t, 5)), 0)
                for t in topics]
        return collator(rows)

    with torch.no_grad():
        before = contrastive_pretraining_losses(model, batch(), 1.0, 0.05)["contrastive_loss"].item()
    for _ in range(40):
        loss = contrastive_pretraining_losses(model, batch(), 1.0, 0.05)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = contrastive_pretraining_losses(model, batch(), 1.0, 0.05)
    assert after["contrastive_loss"].item() < before - 1.0
    assert after["contrastive_acc"].item() > 0.5


def test_the_contrastive_loss_is_refused_where_the_segments_are_read_together(tmp_path):
    with pytest.raises(ValueError, match="next_sentence_prediction=false"):
        validate(tiny_config(tmp_path, ["pretrain.contrastive_weight=0.5", "pretrain.next_sentence_prediction=true"]))
    with pytest.raises(ValueError, match="contrastive_temperature"):
        validate(tiny_config(tmp_path, ["pretrain.contrastive_weight=0.5", "pretrain.next_sentence_prediction=false",
                                        "pretrain.contrastive_temperature=0"]))


@pytest.mark.slow
def test_contrastive_pretraining_runs_through_the_stages(tmp_path, ray_session):
    run = TinyRun(tiny_config(tmp_path, ["pretrain.contrastive_weight=0.5", "pretrain.next_sentence_prediction=false",
                                         "finetune.seeds=[1]"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "word2vec"):
        run.run_stage(stage)
    summary = run.run_stage("bert_pretrain")
    assert summary["final_val_contrastive_acc"] is not None and summary["final_val_nsp_acc"] is None
    rows = {r["model"]: r for r in run.run_stage("finetune")["results"]}
    assert 0.0 <= rows["bert"]["score"] <= 1.0
