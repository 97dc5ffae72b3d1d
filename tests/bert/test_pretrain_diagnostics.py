"""Whether pretraining learned anything: the unigram baseline of the held-out masked-LM targets and the plateau
warning (pipeline/bert/diagnostics.py), and the token counts they are computed from."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from data_prep.examples.bert_examples import TrainingInstance, write_instances
from models import IGNORE_INDEX
from models.bert import BertForPreTraining, bert_config
from pipeline.bert.data import BertPretrainingCollator, PretrainingInstances
from pipeline.bert.diagnostics import PLATEAU_MARGIN_NATS, plateau_message, unigram_cross_entropy
from pipeline.bert.module import bert_pretraining_losses
from pipeline.engine.arrow import read_arrow
from pipeline.engine.optim import adamw_with_schedule
from tests.helpers import successor_corpus

CLS, SEP, MASK = 2, 3, 4


def test_unigram_cross_entropy_equals_the_hand_computation():
    # ids 0-4 special (zeroed by the caller); 5 seen 3 times, 6 once, 7 never but a held-out target
    counts = np.array([0, 0, 0, 0, 0, 3, 1, 0])
    # add-one over the ids that can occur (5, 6, 7): p = 4/7, 2/7, 1/7
    expected = -(math.log(4 / 7) * 2 + math.log(2 / 7) + math.log(1 / 7)) / 4
    assert unigram_cross_entropy(counts, np.array([5, 5, 6, 7])) == pytest.approx(expected)
    with pytest.raises(ValueError, match="no held-out targets"):
        unigram_cross_entropy(counts, np.array([], dtype=int))


def test_token_counts_leave_out_the_held_out_instances(tmp_path):
    instances = [TrainingInstance([5, 6], [7], False), TrainingInstance([5], [5, 8], True),
                 TrainingInstance([9], [6], False)]
    write_instances(instances, tmp_path / "a.arrow", CLS, SEP)
    write_instances(instances[:1], tmp_path / "b.arrow", CLS, SEP)
    dataset = PretrainingInstances([read_arrow(tmp_path / "a.arrow"), read_arrow(tmp_path / "b.arrow")])
    counts = dataset.token_counts(12, excluded=np.array([1]))  # instance 1: [CLS] 5 [SEP] 5 8 [SEP]
    expected = np.zeros(12, dtype=int)
    for ids in ([5, 6, 7], [9, 6], [5, 6, 7]):
        np.add.at(expected, ids, 1)
    expected[CLS], expected[SEP] = 3, 6
    assert counts.tolist() == expected.tolist()


def test_plateau_message_fires_only_within_the_margin_of_the_baseline():
    assert "unigram plateau" in plateau_message(6.70, 6.81)
    assert "unigram plateau" in plateau_message(7.20, 6.81)  # worse than frequencies alone
    assert plateau_message(6.81 - PLATEAU_MARGIN_NATS - 0.01, 6.81) is None
    assert plateau_message(None, 6.81) is None and plateau_message(5.0, None) is None
    assert "pretrain.max_steps" in plateau_message(6.7, 6.81)  # tells the user what to try


def test_a_loss_above_the_baseline_is_said_to_be_above_it():
    """A negative gap read "only -0.39 nats below" the baseline."""
    assert "is 0.39 nats above the 6.810 a model knowing only token frequencies" in plateau_message(7.20, 6.81)
    assert "is only 0.11 nats below the 6.810" in plateau_message(6.70, 6.81)
    assert "is only 0.00 nats below" in plateau_message(6.81, 6.81)


@torch.no_grad()
def _held_out_mlm_loss(model, batches) -> float:
    model.eval()
    return float(np.mean([float(bert_pretraining_losses(model, b)["mlm_loss"]) for b in batches]))


def test_the_warning_fires_on_an_untrained_model_and_not_on_a_trained_one():
    vocab = 45
    rng = np.random.default_rng(0)
    collator = BertPretrainingCollator(pad_id=0, mask_id=MASK, vocab_size=vocab, special_ids=range(5),
                                       mlm_probability=0.15, generator=torch.Generator().manual_seed(0))
    train, held_out = successor_corpus(rng, 2000, vocab), successor_corpus(rng, 64, vocab)
    val_batches = [collator(held_out[i:i + 32]) for i in range(0, 64, 32)]
    counts = np.bincount(np.concatenate([r["input_ids"] for r in train]), minlength=vocab)
    counts[:5] = 0
    targets = torch.cat([b["mlm_labels"][b["mlm_labels"] != IGNORE_INDEX] for b in val_batches]).numpy()
    unigram = unigram_cross_entropy(counts, targets)
    assert unigram == pytest.approx(math.log(vocab - 5), abs=0.05)

    torch.manual_seed(0)
    model = BertForPreTraining(bert_config("bert_tiny", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, max_position_embeddings=16, pre_layer_norm=True,
                                           position_embedding_type="relative", hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0))
    assert plateau_message(_held_out_mlm_loss(model, val_batches), unigram) is not None

    steps = 200
    optimization = adamw_with_schedule(model, 1e-2, 0.0, (0.9, 0.999), 10, steps)
    optimizer, schedule = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    model.train()
    for step in range(steps):
        batch = collator([train[int(i)] for i in rng.integers(0, len(train), 32)])
        optimizer.zero_grad()
        bert_pretraining_losses(model, batch)["mlm_loss"].backward()
        optimizer.step()
        schedule.step()
    trained = _held_out_mlm_loss(model, val_batches)
    assert trained < unigram - 1.0
    assert plateau_message(trained, unigram) is None
