"""experiment=bert_vs_gpt (issue 17 item 7; seed 004): one run pretrains BERT and GPT, each from its own model and
pretraining settings, and fine-tunes both beside their random-init twins into one results table."""
from __future__ import annotations

import csv

import pytest
from hydra import compose, initialize_config_dir

from models.bert import BertForPreTraining
from models.gpt import GPTLMHeadModel, load_pretrained
from pipeline import CONF_DIR
from pipeline.bert.pretrain import BertPretraining, phase_of
from pipeline.engine.dag import resolve_upstream, run_dag, select_stages, stage_hashes
from pipeline.engine.pretraining import instantiate_model
from pipeline.engine.settings import model_key, typed_settings
from pipeline.gpt.pretrain import GPTPretraining
from pipeline.runner import validate
from pipeline.schema import PretrainConfig
from pipeline.stages import STAGES
from tests.helpers import tiny_config


def _compose(tmp_path, experiment: str, extra: tuple[str, ...] = ()):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[f"+experiment={experiment}", f"paths.run_dir={tmp_path}",
                                                        *extra])


def test_one_run_has_both_families_stages_and_fine_tune_kinds(tmp_path):
    cfg = _compose(tmp_path, "bert_vs_gpt")
    stages = resolve_upstream(STAGES, cfg)
    in_run = select_stages(stages, list(cfg.pipeline.stages), None)
    assert {"bert_tokenizer", "bert_examples", "bert_pretrain", "gpt_tokenizer", "gpt_blocks",
            "gpt_pretrain"} <= set(in_run)
    assert in_run[-2:] == ["finetune", "report"]
    assert list(cfg.finetune.models) == ["bert", "bert_random", "gpt", "gpt_random"]
    assert {"bert_pretrain", "gpt_pretrain"} <= set(stages["finetune"].upstream)
    assert {"bert_pretrain", "gpt_pretrain", "finetune"} <= set(stages["report"].upstream)


def test_bert_and_gpt_each_read_their_own_model_and_pretraining_settings(tmp_path):
    cfg = _compose(tmp_path, "bert_vs_gpt")
    bert, gpt = BertPretraining(phase_of("bert_pretrain")).settings(cfg), GPTPretraining().settings(cfg)
    assert (bert.max_steps, gpt.max_steps) == (cfg.pretrain.max_steps, cfg.gpt.pretrain.max_steps)
    assert bert.max_steps != gpt.max_steps and bert.betas != gpt.betas
    assert gpt.batch_size == bert.batch_size == cfg.pretrain.batch_size  # a key gpt.pretrain leaves out is pretrain's
    assert isinstance(instantiate_model(cfg, vocab_size=64), BertForPreTraining)
    gpt_model = instantiate_model(cfg, model_key(cfg, "gpt"), vocab_size=64, eos_token_id=0, n_positions=16)
    assert isinstance(gpt_model, GPTLMHeadModel) and gpt_model.config.n_embd == 128
    assert GPTPretraining().settings_key(cfg) == "gpt.pretrain"  # what a divergence message asks to lower


def test_a_gpt_only_run_reads_the_shared_model_and_pretrain_blocks(tmp_path):
    cfg = _compose(tmp_path, "gpt_tiny")
    assert model_key(cfg, "gpt") == "model"
    assert GPTPretraining().settings(cfg) == typed_settings(cfg.pretrain, PretrainConfig)
    assert GPTPretraining().settings_key(cfg) == "pretrain"  # its gpt.pretrain is all null


def test_a_gpt_setting_reruns_gpt_pretraining_and_not_berts(tmp_path):
    names = ["bert_pretrain", "gpt_pretrain", "finetune"]
    before = stage_hashes(_compose(tmp_path, "bert_vs_gpt"), STAGES, names)
    after = stage_hashes(_compose(tmp_path, "bert_vs_gpt", ("gpt.pretrain.max_steps=7",)), STAGES, names)
    assert before["bert_pretrain"] == after["bert_pretrain"]
    assert before["gpt_pretrain"] != after["gpt_pretrain"] and before["finetune"] != after["finetune"]


@pytest.mark.slow  # 24 s on the 2-core machine at a load of 1, 93 s at a load of 8
def test_bert_vs_gpt_shrunk_runs_both_families_into_one_report(tmp_path, ray_session):
    """The experiment's own config, shrunk to seconds (tiny corpus and models, a dozen steps each): both families
    pretrain, the four kinds fine-tune on one task, and the report has them in one table, each family against its
    random twin, the pretraining budget of each, and GPT's samples."""
    cfg = tiny_config(tmp_path, ["pretrain.max_steps=12", "pretrain.val_every_steps=6", "gpt.vocab_size=300",
                                 "gpt.min_frequency=1", "gpt.block_size=16", "+gpt.model.config.n_embd=32",
                                 "gpt.pretrain.max_steps=8", "gpt.pretrain.warmup_steps=2"], experiment="bert_vs_gpt")
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    assert {"bert_pretrain", "gpt_pretrain", "finetune", "report"} <= set(results)
    assert (results["bert_pretrain"]["steps"], results["gpt_pretrain"]["steps"]) == (12, 8)
    assert load_pretrained(tmp_path / "run" / "gpt_pretrain" / "model").config.n_embd == 32  # gpt.model, not `model`
    report = (tmp_path / "run" / "report" / "results.md").read_text()
    with open(tmp_path / "run" / "report" / "results.csv") as f:
        assert {"bert", "bert_random", "gpt", "gpt_random"} <= {r["model"] for r in csv.DictReader(f)}
    for line in ("- sst2 accuracy: bert - bert_random = ", "- sst2 accuracy: gpt - gpt_random = ",
                 "## Pretraining budget", "| bert | bert_pretrain | 12 | ", "| gpt | gpt_pretrain | 8 | ",
                 "## GPT samples"):
        assert line in report, line
