"""The encoder-decoder family out of a run: seed 000's pre-LN Transformer (`model=seq2seq_tiny`, which BART cannot
compute) and the RNN encoder-decoder (seq2seq_tiny's default), each without and with copy attention (See et al.'s
pointer-generator), each pretrained a few steps in a run directory, exported by `python -m pipeline.export` with our
modelling code and a card, loaded by transformers' AutoModelForSeq2SeqLM in a fresh process that cannot import this
repository (tests/hf_checks.py), where its logits are ours and `generate` writes what `python -m pipeline.generate
RUN_DIR --input FILE` writes, one line per input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")  # test-only: loading is the user's side, never the pipeline's

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer  # noqa: E402
from models.generation import greedy  # noqa: E402
from pipeline.export import main as export_main  # noqa: E402
from pipeline.generate import main as generate_main  # noqa: E402
from pipeline.seq2seq.architectures import load_model  # noqa: E402
from tests.helpers import seq2seq_transformer_config, tiny_config  # noqa: E402
from tests.hf_checks import STEPS, load_in_a_fresh_process, max_diff, with_overrides, write_run_directory  # noqa: E402
from tests.seq2seq.test_rnn_attn_pipeline import RNN_TINY  # noqa: E402

# Unequal lengths (padding), and repeated words: a repeated source token gets each of its copy shares
SOURCES = ["The old man saw the ship at night, and the ship saw the old man.", "a stranger"]
ARCHITECTURES = {"transformer": "TextrepSeq2SeqForConditionalGeneration",
                 "rnn": "TextrepRNNSeq2SeqForConditionalGeneration",
                 "transformer-copy": "TextrepSeq2SeqForConditionalGeneration",
                 "rnn-copy": "TextrepRNNSeq2SeqForConditionalGeneration"}
# seq2seq_tiny copies by default; each variant says which it is
COPY_ATTENTION, NO_COPY = ["model.config.copy_attention=true"], ["model.config.copy_attention=false"]
PRETRAIN_ONLY = [*STEPS, "pipeline.stages=[seq2seq_pretrain]"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, family_data):
    """architecture -> its run directory, its export, and what the fresh process gave."""
    root = tmp_path_factory.mktemp("seq2seq_export")
    default = family_data("seq2seq").cfg  # seq2seq_tiny's RNN: general attention, no input feeding
    data_root = Path(default.paths.cache_dir).parent  # each reads the same books, tokenizer and pairs
    transformer = seq2seq_transformer_config(data_root)
    # rnn_attn_small's input feeding, the decoder step that seq2seq_tiny's RNN leaves out
    rnn = tiny_config(data_root, [*RNN_TINY, "model.config.attention=general", "model.config.cell=lstm"],
                      experiment="seq2seq_tiny")
    runs, cases = {}, []
    for name, cfg in (("transformer", with_overrides(transformer, NO_COPY)), ("rnn", with_overrides(rnn, NO_COPY)),
                      ("transformer-copy", with_overrides(transformer, COPY_ATTENTION)),
                      ("rnn-copy", with_overrides(default, COPY_ATTENTION))):
        run_dir = root / name / "run"
        cfg = with_overrides(cfg, [*PRETRAIN_ONLY, f"paths.run_dir={run_dir}"])
        write_run_directory(cfg, run_dir, ["+experiment=seq2seq_tiny", *PRETRAIN_ONLY])
        assert export_main([str(run_dir), "--to", str(root / name / "exported")]) == 0
        directory = root / name / "exported" / "seq2seq"
        model_dir = run_dir / "seq2seq_pretrain" / "model"
        tokenizer, model = load_seq2seq_tokenizer(model_dir), load_model(model_dir).eval()
        eos = model.config.eos_token_id
        sources = [[*tokenizer.encode(text).ids, eos] for text in SOURCES]
        width = max(map(len, sources))
        batch = {"input_ids": torch.tensor([s + [model.config.pad_token_id] * (width - len(s)) for s in sources]),
                 "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sources]),
                 "decoder_input_ids": torch.tensor([[model.config.decoder_start_token_id,
                                                     *tokenizer.encode("The old man").ids]] * len(sources))}
        torch.save(batch, root / name / "inputs.pt")
        runs[name] = {"run_dir": run_dir, "directory": directory, "model": model, "tokenizer": tokenizer,
                      "sources": sources, "batch": batch}
        cases.append({"name": name, "dir": str(directory), "auto": ["AutoModelForSeq2SeqLM"],
                      "inputs": str(root / name / "inputs.pt")})
    loaded = load_in_a_fresh_process(cases, root)
    yield {name: {**run, "loaded": loaded[name]} for name, run in runs.items()}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_export_loads_with_our_logits_and_writes_what_our_model_writes(exported, name):
    run = exported[name]
    out = run["loaded"]
    assert out["classes"] == {"AutoModelForSeq2SeqLM": ARCHITECTURES[name]}
    batch, model = run["batch"], run["model"]
    assert model.config.copy_attention == name.endswith("-copy")
    # what copying must get right: a token repeated in a source, and the padding of the shorter one
    first = batch["input_ids"][0].tolist()
    assert len(set(first)) < len(first) and not batch["attention_mask"][1].all()
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"]).logits
    max_diff(f"seq2seq {name}: AutoModelForSeq2SeqLM logits", logits, out["AutoModelForSeq2SeqLM"]["logits"])
    start = model.config.decoder_start_token_id
    assert out["generated"] == [[start, *tokens] for tokens in greedy(model, run["sources"], 8)]


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_card_says_what_the_model_is_and_how_to_load_it(exported, name):
    run = exported[name]
    config = json.loads((run["directory"] / "config.json").read_text())
    code = next(iter(config["auto_map"].values())).split(".")[0]
    assert (run["directory"] / f"{code}.py").is_file()
    _, metadata, body = (run["directory"] / "README.md").read_text().split("---\n", 2)
    metadata = yaml.safe_load(metadata)
    assert metadata["pipeline_tag"] == "text2text-generation" and "custom_code" in metadata["tags"]
    assert f'AutoModelForSeq2SeqLM.from_pretrained("{run["directory"]}", trust_remote_code=True)' in body
    assert f"its code is `{code}.py` in this directory" in body
    described = {"transformer": "2 + 2 layers, hidden size 32, 2 attention heads, feed-forward size 64, "
                                "pre-LayerNorm blocks, sinusoidal positions",
                 "rnn": "bidirectional LSTM encoder, LSTM decoder, 1 layer(s) each, hidden size 32, "
                        "16-value embeddings shared by source, target and output, general attention, input feeding"}
    # rnn-copy is seq2seq_tiny's own RNN, which leaves input feeding out
    described["rnn-copy"] = described["rnn"].removesuffix(", input feeding")
    assert described.get(name, described[name.removesuffix("-copy")]) in body
    assert ("input feeding" in body) == (name == "rnn")
    copying = "copy attention (See et al. 2017's pointer-generator, which the modelling code computes"
    assert (copying in body) == name.endswith("-copy")


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_generate_writes_one_line_per_input_as_the_export_writes(exported, name, tmp_path, capsys):
    run = exported[name]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(SOURCES) + "\n")
    assert generate_main([str(run["run_dir"]), "--input", str(inputs), "--max-new-tokens", "8",
                          "--no-fast-kernels"]) == 0
    eos = run["model"].config.eos_token_id
    written = [" ".join(run["tokenizer"].decode([t for t in ids[1:] if t != eos]).splitlines())
               for ids in run["loaded"]["generated"]]
    assert capsys.readouterr().out.splitlines() == written
    inputs.write_text(f"{SOURCES[0]}\n\n{SOURCES[1]}\n")
    assert generate_main([str(run["run_dir"]), "--input", str(inputs)]) == 2
    assert "line 2 of --input" in capsys.readouterr().err
