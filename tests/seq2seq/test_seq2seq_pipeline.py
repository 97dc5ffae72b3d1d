"""The seq2seq family through the pipeline's DAG on a tiny corpus: tokenizer, pairs, denoising pretraining (whose
held-out loss must fall), its encoder probed beside its random twin, and the report; shrunk to seconds."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer, special_ids
from models.generation import greedy
from models.seq2seq import load_pretrained
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import plan, run_dag, stage_hashes
from pipeline.generate import main as generate
from pipeline.runner import validate
from pipeline.seq2seq.architectures import load_model
from pipeline.stages import STAGES
from tests.helpers import SENTEVAL_MR_ONLY, TINY_FAMILIES, TinyRun, family_config, seq2seq_transformer_config, write_mr


def val_losses(stage_dir: Path) -> dict[int, float]:
    with open(stage_dir / "loss_curve.csv") as f:
        return {int(r["step"]): float(r["value"]) for r in csv.DictReader(f) if r["name"] == "val/loss"}


def test_seq2seq_tiny_pretrains_its_held_out_loss_falls_and_its_encoder_is_probed(tmp_path, ray_session, capsys):
    write_mr(tmp_path / "senteval" / "MR")
    cfg = family_config(tmp_path, "seq2seq", [
        *SENTEVAL_MR_ONLY, "pipeline.stages=[seq2seq_pretrain,evaluate,report]", "pretrain.max_steps=60",
        "pretrain.val_every_steps=20", "pretrain.warmup_steps=10", "pretrain.lr=3e-3"])
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    assert [s for s in results if s != "word2vec"] == ["prepare", "seq2seq_tokenizer", "seq2seq_examples",
                                                       "seq2seq_pretrain", "evaluate", "report"]
    assert results["seq2seq_examples"]["objective"] == "bart" and results["seq2seq_examples"]["examples"] > 100
    pretrain = results["seq2seq_pretrain"]
    losses = val_losses(tmp_path / "run" / "seq2seq_pretrain")
    assert sorted(losses) == [20, 40, 60]
    assert losses[60] < losses[20] - 0.3 and pretrain["final_val_loss"] < pretrain["uniform_val_loss"] - 1.5
    with open(tmp_path / "run" / "report" / "results.csv") as f:
        probed = {(r["model"], r["task"]) for r in csv.DictReader(f) if r["stage"] == "evaluate"}
    assert {("seq2seq_mean", "MR"), ("seq2seq_mean_random", "MR")} <= probed
    model_dir = tmp_path / "run" / "seq2seq_pretrain" / "model"
    model, tokenizer = load_model(model_dir), load_seq2seq_tokenizer(model_dir)
    ids = special_ids(tokenizer)
    assert (model.config.pad_token_id, model.config.decoder_start_token_id, model.config.eos_token_id) == ids[:3]
    source = [*tokenizer.encode("The old man saw the ship").ids, ids.eos]
    assert len(greedy(model, [source], 8)[0]) <= 8
    assert "seq2seq_pretrain" in (tmp_path / "run" / "report" / "results.md").read_text()
    # python -m pipeline.generate RUN_DIR --prompt: the run's encoder-decoder writes from a source
    assert generate([str(tmp_path / "run"), "--prompt", "The old man saw the ship", "--strategy", "beam", "--beams",
                     "2", "--max-new-tokens", "6"]) == 0
    assert [line[:4] for line in capsys.readouterr().out.splitlines() if line.startswith("[")] == ["[1] ", "[2] "]
    assert generate([str(tmp_path / "run"), "--prompt", "The old man", "--family", "gpt"]) == 2
    assert "has no gpt_pretrain stage output" in capsys.readouterr().err


@pytest.mark.parametrize("objective", ["span_corruption", "gap_sentences"])
def test_the_pairs_are_those_of_the_objective_seq2seq_objective_names(tmp_path, ray_session, objective):
    # gap sentences need blocks of two sentences or more: the tiny runs' 32 tokens of a near-byte-level BPE hold one
    blocks = ["seq2seq.block_size=128"] if objective == "gap_sentences" else []
    run = TinyRun(family_config(tmp_path, "seq2seq", [f"seq2seq.objective={objective}", *blocks]))
    for name in TINY_FAMILIES["seq2seq"].data_stages:
        summary = run.run_stage(name)
    assert summary["objective"] == objective
    ids = special_ids(load_seq2seq_tokenizer(run.stage_dir("seq2seq_tokenizer")))
    assert len(ids.sentinels) == 8
    table = read_arrow(sorted(run.stage_dir("seq2seq_examples").glob("examples-*.arrow"))[0])
    for source, target in zip(table.column("source").to_pylist(), table.column("target").to_pylist()):
        if objective == "span_corruption":
            assert target[0] == ids.sentinels[0]
        else:  # whole sentences masked in the source, generated in the target
            assert ids.mask in source and ids.mask not in target and target[-1] == ids.eos
    examples = json.loads((run.stage_dir("seq2seq_examples") / "stage.json").read_text())["examples"]
    assert examples > (50 if objective == "gap_sentences" else 100)  # 71 blocks of 128 tokens; 336 of 32


def test_the_objective_is_checked_at_composition_and_keys_the_pairs_and_what_follows(tmp_path):
    base = family_config(tmp_path, "seq2seq")
    gap = family_config(tmp_path, "seq2seq", ["seq2seq.objective=gap_sentences"])
    names = plan(base, STAGES).order
    a, b = stage_hashes(base, STAGES, names), stage_hashes(gap, STAGES, names)
    assert [n for n in names if a[n] != b[n]] == names[names.index("seq2seq_examples"):]
    assert a["seq2seq_tokenizer"] == b["seq2seq_tokenizer"]
    with pytest.raises(ConfigCompositionException, match="seq2seq.objective"):
        family_config(tmp_path, "seq2seq", ["seq2seq.objective=gap_sentence"])


def test_a_bart_shaped_model_is_written_as_huggingface_bart_and_seed_000s_with_our_code(tmp_path, ray_session):
    """hf/ where the config is BART's (models.seq2seq.bart_config): transformers loads it, its logits are ours to
    1e-5 and its tokenizer gives the pipeline's ids; seed 000's pre-LN, sinusoidal model is written with our
    modelling code (tests/seq2seq/test_seq2seq_export.py loads it)."""
    transformers = pytest.importorskip("transformers")
    run = TinyRun(seq2seq_transformer_config(tmp_path, ["model.config._target_=models.seq2seq.bart_config",
                                                      "model.config.copy_attention=false",  # BART cannot copy
                                                      "pretrain.max_steps=4", "pretrain.val_every_steps=2"]))
    for name in (*TINY_FAMILIES["seq2seq"].data_stages, "seq2seq_pretrain"):
        summary = run.run_stage(name)
    assert summary["hf"] == "BartForConditionalGeneration"
    out = run.stage_dir("seq2seq_pretrain")
    ours, tokenizer = load_pretrained(out / "model").eval(), load_seq2seq_tokenizer(out / "model")
    hf = transformers.BartForConditionalGeneration.from_pretrained(out / "hf", attn_implementation="eager").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf")
    text = "The old man saw the ship."
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text).ids
    ids = torch.tensor([[*tokenizer.encode(text).ids, ours.config.eos_token_id]])
    decoder_ids = torch.tensor([[ours.config.decoder_start_token_id, *tokenizer.encode("The old").ids]])
    with torch.no_grad():
        theirs = hf(input_ids=ids, decoder_input_ids=decoder_ids).logits
        torch.testing.assert_close(ours(ids, decoder_ids).logits, theirs, atol=1e-5, rtol=1e-5)
    seed_000 = TinyRun(seq2seq_transformer_config(tmp_path, ["pretrain.max_steps=4", "pretrain.val_every_steps=2"]))
    summary = seed_000.run_stage("seq2seq_pretrain")
    assert summary["hf"] == "TextrepSeq2SeqForConditionalGeneration"
    assert (seed_000.stage_dir("seq2seq_pretrain") / "hf" / "modeling_textrep_seq2seq.py").is_file()
