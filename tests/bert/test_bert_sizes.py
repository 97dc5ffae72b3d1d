"""Named BERT sizes as Hydra model configs, and the BERT-base recipe: composes, has 110M parameters, trains a step."""
from __future__ import annotations

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from models.bert import BERT_SIZES
from pipeline import CONF_DIR
from pipeline.bert.module import BertPretrainModule
from pipeline.bert.pretrain import phase_of
from pipeline.downstream.finetune import finetune_upstream
from pipeline.engine.module import OptimizerSettings


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["paths.run_dir=/unused", *overrides])


def _instantiate_model(cfg) -> torch.nn.Module:
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["config"]["vocab_size"] = cfg.tokenizer.vocab_size  # the pipeline sets it from the trained tokenizer
    return hydra.utils.instantiate(model_cfg, _convert_="all")


@pytest.mark.parametrize("name", ["bert_tiny", "bert_mini", "bert_small", "bert_base"])
def test_model_config_is_the_named_size(name):
    cfg = _compose(f"model={name}")
    assert cfg.model.config.name == name
    with torch.device("meta"):  # shapes only: nothing allocated or initialised
        model = _instantiate_model(cfg)
    c = model.config
    expected = BERT_SIZES[name]
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (
        expected["num_hidden_layers"], expected["hidden_size"], expected["num_attention_heads"],
        expected["intermediate_size"])


def test_bert_base_recipe_is_the_papers():
    cfg = _compose("+experiment=bert_base")
    p = cfg.pretrain
    assert ((p.batch_size, p.lr, p.warmup_steps, list(p.betas), p.weight_decay)
            == (256, 1e-4, 10_000, [0.9, 0.999], 0.01))
    assert cfg.examples.max_seq_length == 128 and p.max_steps == 900_000  # phase 1: 90 % of 1M steps at length 128
    assert cfg.tokenizer.vocab_size == 30522 and cfg.model.config.max_position_embeddings == 512


def test_bert_base_runs_phase_2_at_512_from_phase_1_and_fine_tunes_its_encoder():
    cfg = _compose("+experiment=bert_base")
    phase1, phase2 = phase_of("bert_pretrain").settings(cfg), phase_of("bert_pretrain_phase2").settings(cfg)
    assert (phase1.max_predictions_per_seq, phase_of("bert_pretrain").max_seq_length(cfg)) == (20, 128)
    assert (phase2.max_predictions_per_seq, phase_of("bert_pretrain_phase2").max_seq_length(cfg)) == (80, 512)
    assert (phase2.max_steps, phase2.batch_size, phase2.lr) == (100_000, 256, 1e-4)  # the last 10 % of 1M steps
    assert (phase2.weight_decay, list(phase2.betas)) == (0.01, [0.9, 0.999])  # phase 1's, not repeated
    assert cfg.model.config.max_position_embeddings >= 512
    assert "bert_pretrain_phase2" in cfg.pipeline.stages
    assert finetune_upstream(cfg) == ("bert_tokenizer", "bert_pretrain_phase2", "word2vec")


def test_bert_base_has_110m_parameters_and_trains_a_step():
    cfg = _compose("+experiment=bert_base", "pretrain.batch_size=2", "pretrain.max_steps=3")
    torch.manual_seed(0)
    model = _instantiate_model(cfg)
    encoder_parameters = sum(p.numel() for p in model.bert.parameters())
    assert abs(encoder_parameters - 110e6) / 110e6 < 0.02, encoder_parameters
    p = cfg.pretrain
    module = BertPretrainModule(model, OptimizerSettings("pretrain", str(p.optimizer), p.lr, p.weight_decay,
                                                         tuple(p.betas), p.warmup_steps, p.max_steps,
                                                         str(p.lr_decay)))
    B, T = p.batch_size, 16
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(5, 30522, (B, T), generator=g),
             "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T),
             "attention_mask": torch.ones(B, T, dtype=torch.long),
             "mlm_positions": torch.tensor([[2, 5, 11]] * B),
             "mlm_labels": torch.randint(5, 30522, (B, 3), generator=g),
             "next_sentence_label": torch.tensor([0, 1])}
    optimizer = module.configure_optimizers()["optimizer"]
    out = module.model_step(batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and abs(out["mlm_loss"].item() - torch.log(torch.tensor(30522.0)).item()) < 1.0
    before = model.bert.encoder.layer[0].intermediate.dense.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, model.bert.encoder.layer[0].intermediate.dense.weight)
