"""`model.config.copy_attention=true` through the seq2seq family's stages, for the Transformer and the RNN: it
composes, pretrains, is written and read back with its pointer-generator and as a HuggingFace directory of our modelling
code (which `python -m pipeline.export` exports), and fine-tunes on headlines with dev decoded by beam search on the
mixture. The mechanism itself: tests/seq2seq/test_copy_attention.py; the export's outputs against ours:
tests/seq2seq/test_seq2seq_export.py."""
from __future__ import annotations

import csv
import json

import pytest
from omegaconf import OmegaConf

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from models.generation import beam_search
from pipeline.engine.dag import run_dag
from pipeline.export import export
from pipeline.runner import validate
from pipeline.seq2seq.architectures import load_model
from pipeline.stages import STAGES
from tests.helpers import SEQ2SEQ_TRANSFORMER, TINY_FAMILIES, tiny_config
from tests.seq2seq.test_seq2seq_finetune import write_headline_task

RNN_TINY = list(TINY_FAMILIES["seq2seq"].overrides)  # seq2seq_tiny's own model, rnn_attn_tiny


@pytest.mark.parametrize("model_overrides", [SEQ2SEQ_TRANSFORMER, RNN_TINY], ids=["seq2seq_tiny", "rnn_attn_tiny"])
def test_copy_attention_pretrains_fine_tunes_and_decodes_through_the_pipeline(tmp_path, ray_session, model_overrides):
    task_dir = write_headline_task(tmp_path / "bbc")
    cfg = tiny_config(tmp_path, [
        *model_overrides, "model.config.copy_attention=true", f"finetune.data_dir={task_dir}",
        "finetune.task=bbc_headlines", "finetune.random_twins=false", "finetune.max_seq_length=32",
        "finetune.lr=3e-3", "pipeline.stages=[seq2seq_pretrain,finetune]", "pretrain.max_steps=10",
        "pretrain.val_every_steps=5"], experiment="seq2seq_tiny")
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    pretrain = results["seq2seq_pretrain"]
    assert pretrain["final_val_loss"] < pretrain["uniform_val_loss"] and "copy attention" in pretrain["model"]
    # BART cannot copy: our modelling code computes it, and export gives the user that directory
    assert pretrain["hf"] in ("TextrepSeq2SeqForConditionalGeneration", "TextrepRNNSeq2SeqForConditionalGeneration")
    hf_config = json.loads((tmp_path / "run" / "seq2seq_pretrain" / "hf" / "config.json").read_text())
    assert hf_config["copy_attention"] and hf_config["architectures"] == [pretrain["hf"]]
    (tmp_path / "run" / ".hydra").mkdir()  # what export reads of a run directory besides the stages
    OmegaConf.save(cfg, tmp_path / "run" / ".hydra" / "config.yaml")
    [exported] = export(tmp_path / "run", tmp_path / "exported")
    assert "copy attention (See et al. 2017's pointer-generator" in (exported / "README.md").read_text()

    model_dir = tmp_path / "run" / "seq2seq_pretrain" / "model"
    model = load_model(model_dir).eval()
    assert model.config.copy_attention and model.pointer is not None
    source = [*load_seq2seq_tokenizer(model_dir).encode("The old man saw the ship.").ids, model.config.eos_token_id]
    found = beam_search(model, source, 6, num_beams=2)
    assert len(found) == 2 and all(h.log_prob <= 0 for h in found)

    rows = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    assert {r["model"] for r in rows} == {"seq2seq", "lead_n"} and all(0 <= r["score"] <= 1 for r in rows)
    with open(tmp_path / "run" / "finetune" / "generated" / "bbc_headlines-seq2seq.tsv", newline="") as f:
        generated = list(csv.DictReader(f, delimiter="\t"))
    assert len(generated) == 12 and all("generated" in g for g in generated)
