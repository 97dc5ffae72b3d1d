"""Seed 001's RNN encoder-decoder (models/rnn_seq2seq.py) as the seq2seq family's model, `model=rnn_attn_small`:
every attention and cell composes and builds from the experiment's config, a bad one stops the run at start-up with
the config's message, and a shrunk run pretrains, fine-tunes on headlines beside its random twin (beam search) and
reports, its rows saying which architecture they are."""
from __future__ import annotations

import csv
import json

import pytest
import torch
from omegaconf import OmegaConf

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer, special_ids
from models.generation import beam_search
from models.rnn_seq2seq import RNNEncoderDecoder
from pipeline.engine.dag import run_dag
from pipeline.engine.pretraining import check_model_config, instantiate_model
from pipeline.export import export
from pipeline.generate import main as generate
from pipeline.runner import validate
from pipeline.seq2seq.architectures import load_model
from pipeline.seq2seq.encoder import Seq2SeqMeanEncoder
from pipeline.stages import STAGES
from tests.helpers import TINY_FAMILIES, tiny_config
from tests.seq2seq.test_seq2seq_finetune import write_headline_task

# the family's tiny overrides without the Transformer's widths, and the RNN at a few thousand parameters
RNN_TINY = [*(o for o in TINY_FAMILIES["seq2seq"].overrides if not o.startswith("+model.config.")),
            "model=rnn_attn_small", "+model.config.embedding_dim=16", "+model.config.hidden_size=32",
            "+model.config.num_layers=1"]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("attention", ["additive", "dot", "general"])
def test_each_attention_and_cell_composes_and_builds_as_the_pretraining_stage_builds_it(tmp_path, attention, cell):
    cfg = tiny_config(tmp_path, ["model=rnn_attn_small", f"model.config.attention={attention}",
                                 f"model.config.cell={cell}"], experiment="seq2seq_tiny")
    check_model_config(cfg)
    model = instantiate_model(cfg, vocab_size=50, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2,
                              max_positions=33)
    assert isinstance(model, RNNEncoderDecoder)
    c = model.config
    assert (c.attention, c.cell, c.num_layers, c.hidden_size, c.vocab_size) == (attention, cell, 2, 512, 50)
    out = model(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 7]]), targets=torch.tensor([[7, 2]]))
    assert out.logits.shape == (1, 2, 50) and torch.isfinite(out.loss)
    assert f"{attention} attention" in model.describe() and cell.upper() in model.describe()


@pytest.mark.parametrize("override,message", [("model.config.attention=bahdanau", "attention must be one of"),
                                              ("model.config.cell=rnn", "cell must be one of")])
def test_a_bad_attention_or_cell_stops_the_run_at_start_up(tmp_path, override, message):
    cfg = tiny_config(tmp_path, [*RNN_TINY, override], experiment="seq2seq_tiny")
    with pytest.raises(ValueError, match=f"model.config: {message}"):
        validate(cfg)


def test_rnn_attn_pretrains_fine_tunes_decodes_and_is_reported(tmp_path, ray_session, capsys):
    task_dir = write_headline_task(tmp_path / "bbc")
    cfg = tiny_config(tmp_path, [
        *RNN_TINY, "model.config.attention=general", "model.config.cell=gru",
        f"finetune.data_dir={task_dir}", "finetune.task=bbc_headlines", "finetune.seeds=[1]",
        "finetune.max_seq_length=32", "finetune.epochs=1", "finetune.lr=3e-3", "finetune.batch_size=16",
        "pipeline.stages=[seq2seq_pretrain,finetune,report]", "pretrain.max_steps=10",
        "pretrain.val_every_steps=5"], experiment="seq2seq_tiny")
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    pretrain = results["seq2seq_pretrain"]
    assert pretrain["final_val_loss"] < pretrain["uniform_val_loss"]
    assert pretrain["hf"] == "TextrepRNNSeq2SeqForConditionalGeneration" and "RNN encoder-decoder" in pretrain["model"]
    model_dir = tmp_path / "run" / "seq2seq_pretrain" / "model"
    model = load_model(model_dir)
    tokenizer = load_seq2seq_tokenizer(model_dir)
    assert isinstance(model, RNNEncoderDecoder) and (model.config.attention, model.config.cell) == ("general", "gru")
    c = model.config  # set from the trained tokenizer, as the Transformer's
    assert (c.pad_token_id, c.decoder_start_token_id, c.eos_token_id) == special_ids(tokenizer)[:3]
    assert c.vocab_size == tokenizer.get_vocab_size() and c.max_positions == 33  # seq2seq.block_size + 1
    assert len(beam_search(model.eval(), [5, 6, 7, c.eos_token_id], 5, num_beams=2)) == 2

    rows = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    metrics = ("rouge1", "rouge2", "rougeL", "bleu", "exact_match")
    assert {(r["model"], r["metric"]) for r in rows} == {(model, metric) for model in ("seq2seq", "seq2seq_random",
                                                                                       "lead_n") for metric in metrics}
    assert all(0 <= r["score"] <= 1 and r["seeds"] == 1 for r in rows)
    with open(tmp_path / "run" / "finetune" / "generated" / "bbc_headlines-seq2seq.tsv", newline="") as f:
        generated = list(csv.DictReader(f, delimiter="\t"))
    assert len(generated) == 12 and all("generated" in g for g in generated)
    report = (tmp_path / "run" / "report" / "results.md").read_text()
    assert "## Models" in report and "- seq2seq (seq2seq_pretrain): RNN encoder-decoder" in report
    assert "general attention" in report and "| seq2seq_random |" in report

    # what the Transformer's path does beside: the frozen encoder, pipeline.generate, and the export (loaded and
    # compared with ours by tests/seq2seq/test_seq2seq_export.py), whose card has the run's fine-tuning rows
    encoder = Seq2SeqMeanEncoder(model_dir, "seq2seq_mean")
    assert encoder.batcher([["the", "old", "man"], ["a", "ship"]]).shape == (2, 32)
    assert generate([str(tmp_path / "run"), "--prompt", "The old man saw the ship", "--strategy", "beam", "--beams",
                     "2", "--max-new-tokens", "4"]) == 0
    assert [line[:4] for line in capsys.readouterr().out.splitlines() if line.startswith("[")] == ["[1] ", "[2] "]
    (tmp_path / "run" / ".hydra").mkdir()  # what python -m pipeline leaves beside the stages (tests/hf_checks.py)
    OmegaConf.save(cfg, tmp_path / "run" / ".hydra" / "config.yaml")
    (exported,) = export(tmp_path / "run", tmp_path / "exported")
    assert (exported / "modeling_textrep_rnn_seq2seq.py").is_file()
    assert "| bbc_headlines | rouge1 |" in (exported / "README.md").read_text()
