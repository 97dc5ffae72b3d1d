"""GPT's pipeline side (issue 17): packing books into blocks, the tokenizer and pretraining stages on the tiny corpus,
the hf/ directory transformers loads, the frozen encoders."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_prep.corpus.shards import shard_paths
from data_prep.examples.gpt_blocks import book_texts, end_of_text_id, load_gpt_tokenizer, pack_blocks
from models.generation import greedy
from models.gpt import load_pretrained
from pipeline.engine.arrow import read_arrow
from pipeline.engine.generation import Request
from pipeline.generate import main as generate_main
from pipeline.gpt import samples
from pipeline.gpt.data_stages import build_shard_blocks
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.samples import load_model
from tests.helpers import TinyRun, family_config

EOT = 0


def test_blocks_tile_the_stream_with_end_of_text_after_every_book_and_drop_only_the_tail():
    books = [list(range(10, 17)), list(range(20, 25)), list(range(30, 41))]
    stream = [*books[0], EOT, *books[1], EOT, *books[2], EOT]  # 26 tokens
    blocks = pack_blocks(books, EOT, block_size=4)
    assert blocks.shape == (6, 5)
    for i, block in enumerate(blocks):
        assert block.tolist() == stream[4 * i: 4 * i + 5]  # consecutive blocks overlap by their boundary token
    # every token after the first is a target exactly once, up to the tail too short for a block
    targets = np.concatenate([b[1:] for b in blocks]).tolist()
    assert targets == stream[1: 1 + len(targets)] and len(stream) - 1 - len(targets) < 4


def test_a_book_that_goes_on_in_the_next_shard_gets_no_end_of_text():
    blocks = pack_blocks([[5, 6, 7], [8, 9, 10]], EOT, block_size=2, last_book_ends=False)
    assert blocks.tolist() == [[5, 6, 7], [7, EOT, 8], [8, 9, 10]]


def test_a_stream_shorter_than_a_block_gives_no_blocks():
    assert pack_blocks([[5, 6]], EOT, block_size=8).shape == (0, 9)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        pack_blocks([[5, 6]], EOT, block_size=0)


def test_book_texts_join_each_books_sentences_in_shard_order():
    assert list(book_texts(["a", "a", "b", "c", "c"], ["A1.", "A2.", "B1.", "C1.", "C2."])) == [
        "A1. A2.", "B1.", "C1. C2."]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, ray_session) -> TinyRun:
    run = TinyRun(family_config(tmp_path_factory.mktemp("gpt"), "gpt", ["pretrain.max_steps=20",
                                                                         "pretrain.val_every_steps=10"]))
    for stage in ("prepare", "gpt_tokenizer", "gpt_blocks", "gpt_pretrain"):
        run.run_stage(stage)
    return run


def test_each_book_gets_one_end_of_text_though_it_spans_shards(pretrained, tmp_path):
    """The tiny books are larger than a tiny shard: each goes on over two. Blocks of 1 keep every token."""
    tok = load_gpt_tokenizer(pretrained.stage_dir("gpt_tokenizer"))
    eot = end_of_text_id(tok)
    shards = shard_paths(pretrained.stage_dir("prepare"))
    books = [read_arrow(p).column("book_id").to_pylist() for p in shards]
    assert any(a[-1] == b[0] for a, b in zip(books, books[1:]))  # a book that goes on in the next shard
    stream = []
    for i, pair in enumerate(zip(shards, [*shards[1:], None])):
        build_shard_blocks(i, pair, pretrained.stage_dir("gpt_tokenizer"), tmp_path, block_size=1)
        blocks = read_arrow(tmp_path / f"blocks-{i:05d}.arrow").column("ids").to_pylist()
        stream += [blocks[0][0], *(b[1] for b in blocks)]
    assert stream.count(eot) == len({b for shard in books for b in shard}) == 6
    after = tok.decode(stream, skip_special_tokens=False).split("<|endoftext|>")
    assert after[-1] == "" and all(text.startswith("Book ") for text in after[:-1])  # books begin right after it


def test_blocks_stage_writes_blocks_of_block_size_plus_one(pretrained):
    files = sorted(pretrained.stage_dir("gpt_blocks").glob("blocks-*.arrow"))
    assert len(files) == len(shard_paths(pretrained.stage_dir("prepare")))
    assert {len(ids) for f in files for ids in read_arrow(f).column("ids").to_pylist()} == {
        pretrained.cfg.gpt.block_size + 1}


def test_pretraining_writes_our_checkpoint_with_its_tokenizer_and_held_out_perplexity(pretrained):
    out = pretrained.stage_dir("gpt_pretrain")
    summary = json.loads((out / "stage.json").read_text())
    assert summary["steps"] == 20
    assert summary["heldout_perplexity"] == pytest.approx(np.exp(summary["final_val_loss"]), rel=1e-3)
    assert summary["heldout_perplexity"] < pretrained.cfg.gpt.vocab_size  # better than a uniform guess
    curve = (out / "loss_curve.csv").read_text()
    assert "val/perplexity" in curve and "train/loss" in curve
    model = load_pretrained(out / "model")
    tok = load_gpt_tokenizer(out / "model")
    assert model.config.eos_token_id == end_of_text_id(tok)
    assert model.config.vocab_size == tok.get_vocab_size()
    assert model.config.n_positions == pretrained.cfg.gpt.block_size


def test_hf_directory_loads_in_transformers_with_the_same_logits_and_tokens(pretrained):
    transformers = pytest.importorskip("transformers")
    out = pretrained.stage_dir("gpt_pretrain")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "hf")
    ours, tok = load_pretrained(out / "model").eval(), load_gpt_tokenizer(out / "model")
    text = "The captain saw the ship at night."
    ids = tok.encode(text).ids[: ours.config.n_positions]
    assert hf_tok(text)["input_ids"][: len(ids)] == ids
    assert hf_tok.eos_token_id == ours.config.eos_token_id
    idx = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx).logits, atol=1e-5, rtol=1e-5)


def test_mean_encoder_and_its_random_twin_embed_sentences_of_any_length(pretrained):
    ctx = type("Ctx", (), {"cfg": pretrained.cfg, "stage_dir": staticmethod(pretrained.stage_dir)})()
    width = load_pretrained(pretrained.stage_dir("gpt_pretrain") / "model").config.n_embd
    long = ["word"] * 500  # past the context: truncated
    batch = [["the", "old", "man"], ["a", "letter"], long, []]
    trained, random = (ENCODERS[name].build(ctx) for name in ("gpt_mean", "gpt_mean_random"))
    a, b = trained.batcher(batch), random.batcher(batch)
    assert a.shape == b.shape == (4, width) and np.isfinite(a).all()
    assert not np.allclose(a, b)
    # right padding leaves a sentence's embedding as it is alone
    np.testing.assert_allclose(trained.batcher([batch[1]])[0], a[1], atol=1e-5)


def linked_run(pretrained: TinyRun, tmp_path) -> Path:
    """A run directory as the engine leaves it: a link per stage to its output."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "gpt_pretrain").symlink_to(pretrained.stage_dir("gpt_pretrain"), target_is_directory=True)
    return run_dir


def test_generate_prints_the_greedy_continuation_and_the_beams_best_first(pretrained, tmp_path, capsys):
    run_dir = linked_run(pretrained, tmp_path)
    model, tok = load_model(run_dir / "gpt_pretrain" / "model")
    prompt = "The old man"
    expected = tok.decode([t for t in greedy(model, [tok.encode(prompt).ids], 5)[0]
                           if t != model.config.eos_token_id])
    assert generate_main([str(run_dir), "--prompt", prompt, "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out == f"{prompt}{expected}\n"
    assert generate_main([str(run_dir), "--prompt", prompt, "--max-new-tokens", "5", "--strategy", "beam",
                          "--beams", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:4] for line in lines] == ["[1] ", "[2] ", "[3] "] and all(prompt in line for line in lines)
    sampled = [str(run_dir), "--prompt", prompt, "--max-new-tokens", "5", "--strategy", "sample", "--top-k", "20",
               "--temperature", "0.8", "--seed", "3"]
    assert generate_main(sampled) == 0 and generate_main(sampled) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first == second  # seeded


@pytest.mark.parametrize("args, message", [
    (["--prompt", "word " * 40], "longer than the model's context"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "The old man", "--strategy", "beam", "--beams", "0"], "--beams must be >= 1"),
    (["--prompt", "The old man", "--max-new-tokens", "500"], "ask for at most"),
])
def test_generate_refuses_bad_input_with_one_line_and_status_2(pretrained, tmp_path, capsys, args, message):
    assert generate_main([str(linked_run(pretrained, tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_generate_names_the_missing_gpt_stage(tmp_path, capsys):
    (tmp_path / "bert_pretrain").mkdir()  # a BERT run
    assert generate_main([str(tmp_path), "--prompt", "The old man"]) == 2
    err = capsys.readouterr().err
    assert "no output of a stage that writes text (gpt_pretrain, seq2seq_pretrain)" in err and "gpt_tiny" in err
    assert generate_main([str(tmp_path), "--prompt", "The old man", "--family", "gpt"]) == 2
    assert "has no gpt_pretrain stage output" in capsys.readouterr().err


def test_generate_names_an_unfinished_gpt_stage(tmp_path, capsys):
    (tmp_path / "gpt_pretrain" / "model").mkdir(parents=True)  # killed before the stage wrote its model and marker
    assert generate_main([str(tmp_path), "--prompt", "The old man"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "gpt_pretrain stage has not finished" in err and err.count("\n") == 1


def test_generate_names_a_run_directory_that_is_not_there(tmp_path, capsys):
    assert generate_main([str(tmp_path / "outputs" / "typo"), "--prompt", "The old man"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'outputs' / 'typo'} is not a directory; pass the run directory a pipeline run " \
                  "printed (run directory: outputs/<experiment>/<date>_<time>)\n"


def test_report_section_shows_greedy_continuations_of_the_fixed_prompts(pretrained, tmp_path):
    lines = samples.report_section(pretrained.cfg, {"gpt_pretrain": pretrained.stage_dir("gpt_pretrain")}, tmp_path,
                                   {})
    assert "## GPT samples" in lines
    shown = [line for line in lines if line.startswith("- **")]
    assert [line.split("**")[1] for line in shown] == list(pretrained.cfg.report.gpt_prompts)
    model, tok = load_model(pretrained.stage_dir("gpt_pretrain") / "model")
    for prompt, line in zip(pretrained.cfg.report.gpt_prompts, shown):
        room = model.config.n_positions - len(tok.encode(prompt).ids)  # the tiny model's context is 16 tokens
        if room < 1:
            assert "not continued: the prompt fills the 16-token context" in line
        else:
            (text,) = samples.continuations(model, tok, prompt, Request(max_new_tokens=min(30, room)))
            assert line.split("**")[2].split() == text.split() and "\n" not in line
