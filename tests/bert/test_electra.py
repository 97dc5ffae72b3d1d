"""ELECTRA's replaced-token detection (models/electra.py, pretrain.objective=electra)."""
from __future__ import annotations

import csv

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException

from models import IGNORE_INDEX
from models.bert import BertConfig, BertModel
from models.electra import ElectraForPreTraining, sample_rows
from pipeline.bert.module import electra_pretraining_losses
from pipeline.runner import validate
from tests.helpers import TinyRun, tiny_config

CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=16)


def _batch() -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 64, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    ids[0, 7:], mask[0, 7:] = 0, 0  # padding
    positions = torch.tensor([[1, 2, 0], [3, 4, 5], [1, 0, 0]])
    labels = torch.tensor([[9, 10, IGNORE_INDEX], [11, 12, 13], [14, IGNORE_INDEX, IGNORE_INDEX]])
    rows, slots = (labels != IGNORE_INDEX).nonzero(as_tuple=True)
    ids[rows, positions[rows, slots]] = 4  # [MASK]
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
            "mlm_positions": positions, "mlm_labels": labels}


def test_the_discriminator_sees_the_original_with_generator_samples_at_the_masked_positions_only():
    torch.manual_seed(0)
    model = ElectraForPreTraining(CONFIG)
    batch = _batch()
    seen = {}
    model.bert.register_forward_pre_hook(lambda module, args: seen.setdefault("ids", args[0].clone()))
    with torch.no_grad():  # a generator that always proposes token 7
        model.generator_predictions.bias.fill_(-1e4)
        model.generator_predictions.bias[7] = 1e4
    mlm_logits, rtd_logits, replaced = model(**batch)
    assert mlm_logits.shape == (3, 3, 64) and rtd_logits.shape == (3, 10) and replaced.shape == (3, 10)

    original = batch["input_ids"].clone()
    rows, slots = (batch["mlm_labels"] != IGNORE_INDEX).nonzero(as_tuple=True)
    columns = batch["mlm_positions"][rows, slots]
    original[rows, columns] = batch["mlm_labels"][rows, slots]
    expected = original.clone()
    expected[rows, columns] = 7
    assert torch.equal(seen["ids"], expected)  # the [MASK]s (id 4) are gone, nothing else changed
    assert torch.equal(replaced, expected != original)
    # a sample equal to the original token counts as original
    batch["mlm_labels"][1, 0] = 7
    assert not model(**batch)[2][1, 3]


def test_the_loss_is_generator_mlm_plus_weighted_detection_over_real_tokens_and_trains_both():
    torch.manual_seed(0)
    model = ElectraForPreTraining(CONFIG)
    batch = _batch()
    torch.manual_seed(1)
    out = electra_pretraining_losses(model, batch, discriminator_weight=50.0)
    torch.manual_seed(1)
    mlm_logits, rtd_logits, replaced = model(**batch)
    real = batch["attention_mask"].bool()
    rtd = F.binary_cross_entropy_with_logits(rtd_logits[real], replaced[real].float())
    mlm = F.cross_entropy(mlm_logits.flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX)
    assert out["rtd_loss"].item() == pytest.approx(rtd.item(), rel=1e-6)
    assert out["loss"].item() == pytest.approx(mlm.item() + 50.0 * rtd.item(), rel=1e-6)

    out["loss"].backward()
    without_gradient = {n for n, p in model.named_parameters() if p.requires_grad and p.grad is None}
    assert without_gradient == set()
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # shared, trained by both
    assert not any(p.requires_grad for p in model.bert.pooler.parameters())  # nothing trains it


def test_a_later_phase_continues_from_the_encoder_and_heads():
    torch.manual_seed(0)
    first = ElectraForPreTraining(CONFIG)
    encoder = BertModel(CONFIG)
    encoder.load_state_dict(first.bert.state_dict())
    second = ElectraForPreTraining(CONFIG)
    second.load_encoder_and_heads(encoder, first.heads_state_dict())
    batch = _batch()
    outputs = []
    for model in (first, second):
        torch.manual_seed(3)
        outputs.append(model(**batch))
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


def test_a_generator_deeper_than_the_discriminator_is_refused():
    with pytest.raises(ValueError, match="generator_layers=3"):
        ElectraForPreTraining(CONFIG, generator_layers=3)


def test_an_impossible_objective_is_refused_before_any_stage_runs(tmp_path):
    with pytest.raises(ValueError, match="next_sentence_prediction=false"):
        validate(tiny_config(tmp_path, ["pretrain.objective=electra", "pretrain.next_sentence_prediction=true"]))
    with pytest.raises(ConfigCompositionException):  # an unknown objective: the schema enum (bert/settings.py)
        tiny_config(tmp_path, ["pretrain.objective=xlnet"])


@pytest.mark.slow
def test_electra_pretraining_learns_and_its_encoder_fine_tunes(tmp_path, ray_session):
    run = TinyRun(tiny_config(tmp_path, ["pretrain.objective=electra", "pretrain.next_sentence_prediction=false",
                                         "finetune.seeds=[1]"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "word2vec"):  # word2vec: fine-tuning's w2v_mean row
        run.run_stage(stage)
    summary = run.run_stage("bert_pretrain")
    assert summary["objective"] == "electra" and summary["final_val_nsp_acc"] is None
    with open(run.stage_dir("bert_pretrain") / "loss_curve.csv") as f:
        rows = list(csv.DictReader(f))
    final = {r["name"]: float(r["value"]) for r in rows if r["split"] == "val"}  # the last validation's
    train = [float(r["value"]) for r in rows if r["name"] == "train/loss"]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 5
    # the discriminator beats the base rate of always answering "original": it reads which tokens were replaced
    assert final["val/rtd_acc"] > 1 - final["val/replaced_fraction"] + 0.005
    rows = {r["model"]: r for r in run.run_stage("finetune")["results"]}
    assert 0.0 <= rows["bert"]["score"] <= 1.0


def test_replacements_are_drawn_in_proportion_to_the_generator_probabilities():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75], [1.0, 0.0, 0.0, 0.0]]).repeat(20_000, 1)
    torch.manual_seed(0)
    drawn = sample_rows(probs).view(20_000, 2)
    assert torch.equal(drawn[:, 1], torch.zeros(20_000, dtype=torch.long))
    first = torch.bincount(drawn[:, 0], minlength=4) / 20_000
    assert first[0] == 0 and first[2] == 0  # never an impossible token
    assert first[1].item() == pytest.approx(0.25, abs=0.01) and first[3].item() == pytest.approx(0.75, abs=0.01)
