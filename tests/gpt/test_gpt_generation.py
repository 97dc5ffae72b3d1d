"""GPT on a generation task in GPT-2's "TL;DR:" format (pipeline/gpt/downstream.py generation_task_data): the loss on
the target alone, a model that learns to write it, and the gpt / gpt_random rows beside the encoder-decoder's in the
fine-tune stage, scored on the test split with finetune.score_split=test."""
from __future__ import annotations

import csv
import json
import random

import torch
from tokenizers import ByteLevelBPETokenizer

from data_prep.examples.gpt_blocks import END_OF_TEXT
from models import IGNORE_INDEX
from models.generation import greedy
from models.gpt import GPTLMHeadModel, gpt_config
from pipeline.downstream.generation import output_summary
from pipeline.engine.dag import run_dag
from pipeline.gpt.downstream import SUMMARY_DELIMITER, collate_generation, generation_rows
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import family_config
from tests.seq2seq.test_seq2seq_finetune import write_headline_task

WORDS = "red green blue cat dog bird runs sits sleeps fast".split()


def _tokenizer() -> ByteLevelBPETokenizer:
    rng = random.Random(0)
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([" ".join(rng.choice(WORDS) for _ in range(6)) + SUMMARY_DELIMITER
                                   for _ in range(300)], vocab_size=400, min_frequency=1, special_tokens=[END_OF_TEXT])
    return tokenizer


def test_a_pair_is_one_sequence_scored_on_the_target_alone():
    tokenizer = _tokenizer()
    eos = tokenizer.token_to_id(END_OF_TEXT)
    rows = generation_rows(tokenizer, ["red cat runs fast", "blue dog"], ["red cat", "blue dog sleeps"],
                           max_source=3, max_target=3, eos=eos)
    delimiter = tokenizer.encode(SUMMARY_DELIMITER).ids
    first = rows[0]
    assert first["prompt"] == [*tokenizer.encode("red cat runs fast").ids[:3], *delimiter]  # the source cut to 3
    answer = [*tokenizer.encode(" red cat").ids[:2], eos]
    assert first["input_ids"].tolist() == [*first["prompt"], *answer[:-1]]  # eos is predicted, never read
    targets = first["targets"].tolist()
    assert targets == [IGNORE_INDEX] * (len(first["prompt"]) - 1) + answer
    # each scored position's target is the token after it
    assert all(t == first["input_ids"][i + 1] for i, t in enumerate(targets[:-1]) if t != IGNORE_INDEX)
    batch = collate_generation(rows, pad_id=eos)
    assert batch["input_ids"].shape == batch["targets"].shape and batch["index"].tolist() == [0, 1]
    assert (batch["targets"][0, len(targets):] == IGNORE_INDEX).all()  # padding is not scored


def test_fine_tuning_in_tldr_format_learns_to_write_the_target():
    """The target is the source's first two words: a model trained on the target's loss alone continues an unseen
    prompt with them, which a shifted or unmasked target would not teach."""
    torch.manual_seed(0)
    rng = random.Random(1)
    tokenizer = _tokenizer()
    eos = tokenizer.token_to_id(END_OF_TEXT)
    sources = [" ".join(rng.choice(WORDS) for _ in range(5)) for _ in range(400)]
    rows = generation_rows(tokenizer, sources, [" ".join(s.split()[:2]) for s in sources], 16, 8, eos)
    model = GPTLMHeadModel(gpt_config("gpt_tiny", vocab_size=tokenizer.get_vocab_size(), n_positions=32, n_embd=64,
                                      n_head=2, eos_token_id=eos))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):  # 100 reached 0.98 (seed 0)
        batch = collate_generation(rng.sample(rows[:350], 32), pad_id=eos)
        loss = model(batch["input_ids"], batch["targets"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = rows[350:]
    written = greedy(model, [row["prompt"] for row in held_out], 8)
    expected = [row["targets"][row["targets"] != IGNORE_INDEX].tolist() for row in held_out]
    assert sum(w == e for w, e in zip(written, expected)) / len(held_out) >= 0.9


def test_gpt_writes_headlines_beside_its_twin_and_lead_n_scored_on_test(tmp_path, ray_session):
    task_dir = write_headline_task(tmp_path / "bbc")
    cfg = family_config(tmp_path, "gpt", [
        f"finetune.data_dir={task_dir}", "finetune.task=bbc_headlines", "finetune.seeds=[1]",
        "finetune.baselines=[lead_n]", "finetune.max_seq_length=32", "finetune.epochs=1", "finetune.batch_size=16",
        "finetune.score_split=test", "gpt.block_size=64", "pipeline.stages=[gpt_pretrain,finetune,report]",
        "pretrain.max_steps=10"])
    validate(cfg)
    run_dag(cfg, STAGES, tmp_path / "run")
    finetune_dir = tmp_path / "run" / "finetune"
    rows = json.loads((finetune_dir / "results.json").read_text())
    assert {(r["model"], r["metric"]) for r in rows} == {(model, metric) for model in ("gpt", "gpt_random", "lead_n")
                                                        for metric in ("rouge1", "rouge2", "rougeL", "bleu",
                                                                       "exact_match")}
    assert {r["scored_on"] for r in rows} == {"test"} and all(0 <= r["score"] <= 1 for r in rows)
    test = [line.split("\t") for line in (task_dir / "test.tsv").read_text().splitlines()[1:]]
    for kind in ("gpt", "gpt_random"):
        with open(finetune_dir / "generated" / f"bbc_headlines-{kind}.tsv", encoding="utf-8", newline="") as f:
            generated = list(csv.DictReader(f, delimiter="\t"))
        assert [(g["source"], g["reference"]) for g in generated] == [(s, t) for s, t in test]
        # the summary on its rows counts what it wrote (one seed: the outputs the samples file keeps)
        summary = next(r for r in rows if r["model"] == kind)["output_summary"]
        assert summary == {**output_summary([g["generated"] for g in generated]), "seed": 1}
    report = (tmp_path / "run" / "report" / "results.md").read_text()
    assert "Fine-tuning (test set, finetune.score_split=test)" in report
    assert "## Generated: bbc_headlines" in report and "| source | reference | gpt | gpt_random |" in report
    assert "## What each model writes: bbc_headlines" in report
