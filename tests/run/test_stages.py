"""One test per pipeline stage, run in order on a tiny corpus inside one run directory."""
from __future__ import annotations

import csv
import json
import re

import pytest

from pipeline.bert.pretrain import PRETRAINING
from pipeline.engine.dag import StageContext
from tests.helpers import TinyRun, tiny_config, write_mr


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, ray_session) -> TinyRun:
    tmp = tmp_path_factory.mktemp("stages")
    write_mr(tmp / "senteval" / "MR")
    return TinyRun(tiny_config(tmp, [
        "pipeline.stages=[prepare,bert_tokenizer,bert_examples,bert_pretrain,finetune,evaluate,report]",
        "evaluate.encoders=[bert_cls,bert_mean]", "senteval.tasks.MR.path=MR", "~senteval.tasks.SICKEntailment",
        "~senteval.tasks.SICKRelatedness", "~senteval.tasks.MRPC", "senteval.classifier.cv_folds=3",
        "senteval.classifier.inner_folds=2",
        # the default sentence is 42 pieces with the 300-word test vocabulary, more than the 32 positions
        "report.attention_sentence='the king saw the ship'"]))


def test_prepare_writes_shards_and_manifest(ctx):
    summary = ctx.run_stage("prepare")
    out = ctx.stage_dir("prepare")
    shards = sorted(out.glob("shard-*.arrow"))
    assert len(shards) >= 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["files"]) == 6
    assert summary["sentences"] > 200
    assert {s["sha256"] for s in manifest["shards"]} and all(len(s["sha256"]) == 64 for s in manifest["shards"])


def test_tokenizer_trains_wordpiece_in_hf_format(ctx):
    summary = ctx.run_stage("bert_tokenizer")
    out = ctx.stage_dir("bert_tokenizer")
    assert (out / "tokenizer.json").is_file() and (out / "vocab.txt").is_file()
    vocab = (out / "vocab.txt").read_text().split("\n")
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 50 < summary["vocab_size"] <= 300


def test_examples_builds_sentence_pairs(ctx):
    from pipeline.engine.arrow import read_arrow

    summary = ctx.run_stage("bert_examples")
    files = sorted(ctx.stage_dir("bert_examples").glob("examples-*.arrow"))
    assert len(files) == len(list(ctx.stage_dir("prepare").glob("shard-*.arrow")))
    table = read_arrow(files[0])
    assert summary["instances"] > 20
    first = table.column("input_ids")[0].as_py()
    assert first[0] == 2 and first[-1] == 3 and len(first) <= 32  # [CLS] … [SEP] within max_seq_length
    labels = [r for f in files for r in read_arrow(f).column("next_sentence_label").to_pylist()]
    assert 0 < sum(labels) < len(labels)  # both NSP classes present


def test_pretrain_lowers_the_loss_and_saves_the_encoder(ctx):
    summary = ctx.run_stage("bert_pretrain")
    out = ctx.stage_dir("bert_pretrain")
    assert summary["steps"] == 30
    assert (out / "encoder" / "config.json").is_file() and (out / "encoder" / "model.safetensors").is_file()
    # bert_tiny's relative positions and pre-LN blocks are not transformers' BERT: hf/ gets our modelling code, and
    # the stage says why (tests/run/test_hf_export.py loads it)
    reason = "HuggingFace's BertModel only expresses learned absolute positions with post-LN blocks; got " \
             "position_embedding_type='relative', pre_layer_norm=True"
    assert summary["hf"] == "hf/" and (out / "hf" / "modeling_textrep_bert.py").is_file()
    assert json.loads((out / "hf" / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"] == \
        "modeling_textrep_bert.TextrepBertForMaskedLM"
    assert (f"stage bert_pretrain: hf/ is TextrepBertForMaskedLM, our modelling code beside the weights (load it with "
            f"trust_remote_code=True): {reason}") in (out / "stage.log").read_text()
    with open(out / "loss_curve.csv") as f:
        train = [float(r["value"]) for r in csv.DictReader(f) if r["name"] == "train/loss"]
    assert len(train) == 30
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 0.5  # MLM on a 300-word vocabulary learns fast


def test_held_out_instances_are_a_fraction_of_the_examples_up_to_a_cap(ctx):
    ctx.run_stage("bert_examples")

    def held_out_and_train(**settings) -> tuple[int, int]:
        cfg = ctx.cfg.copy()
        for key, value in settings.items():
            cfg.pretrain[key] = value
        stage = StageContext(cfg, "bert_pretrain", ctx.stage_dir("bert_pretrain"),
                             {u: ctx.stage_dir(u) for u in ctx.plan.stages["bert_pretrain"].upstream})
        task = PRETRAINING["bert_pretrain"]
        settings = task.settings(cfg)
        data = task.data(stage, task.build_module(stage, settings), settings, rank=0, world_size=1)
        return sum(len(batch["input_ids"]) for batch in data.val_batches), data.train_instances

    held_out, train = held_out_and_train(val_fraction=0.1, val_max_instances=10**9)
    total = held_out + train
    assert held_out == int(0.1 * total) > 7
    assert held_out_and_train(val_fraction=0.1, val_max_instances=7) == (7, total - 7)


def test_word2vec_learns_vectors_of_the_prepared_corpus(ctx):
    summary = ctx.run_stage("word2vec")
    out = ctx.stage_dir("word2vec")
    words = (out / "words.txt").read_text().split("\n")
    assert summary["vocabulary"] == len(words) > 20 and {"captain", "ship", "."} <= set(words)
    assert summary["vector_size"] == 100 and summary["corpus_words"] > 1000


def test_finetune_compares_pretrained_and_random_init(ctx):
    summary = ctx.run_stage("finetune")
    rows = {r["model"]: r for r in summary["results"]}
    assert set(rows) == {"bert", "bert_random", "majority_class", "bow_logreg", "w2v_mean"}
    for row in rows.values():
        assert row["task"] == "sst2" and row["metric"] == "accuracy" and 0.0 <= row["score"] <= 1.0
        assert row["dev_examples"] == 40
    # pretrained from random initialisation (the tiny run's pretrain.init_embeddings): the twin is the control too
    assert {model: row.get("control") for model, row in rows.items() if "control" in row} == {"bert": "bert_random"}


def test_evaluate_probes_frozen_encoders(ctx):
    rows = ctx.run_stage("evaluate")["results"]
    assert [(r["model"], r["task"], r["metric"]) for r in rows] == [("bert_cls", "MR", "accuracy"),
                                                                    ("bert_mean", "MR", "accuracy")]
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)


def test_report_writes_results_table_and_loss_summary(ctx):
    ctx.run_stage("report")
    out = ctx.stage_dir("report")
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["bert", "bert_random", "majority_class", "bow_logreg", "w2v_mean",
                                         "bert_cls", "bert_mean"]
    assert set(rows[0]) == {"stage", "model", "task", "metric", "score", "std", "seeds", "train_size",
                            "train_examples"}
    md = (out / "results.md").read_text()
    assert "against the unigram baseline" in md  # the pretrain stage measured it (pipeline/bert/diagnostics.py)
    # a random start reads no piece vectors: the row states its tokenizer's [UNK] rate alone
    assert re.search(r"\| bert \(\[UNK\] \d+\.\d% of the task's tokens\) \| sst2 \| accuracy \|", md)
    assert "## Pretraining (bert_pretrain)" in md and "train loss" in md
    assert "| encoder | MR accuracy |" in md
    assert (out / "bert_pretrain_loss.png").stat().st_size > 1000
    assert json.loads((out / "results.json").read_text())[0]["model"] == "bert"
    assert (out / "task_scores.png").stat().st_size > 1000 and (out / "attention.png").stat().st_size > 1000
    assert "![attention heat-map](attention.png)" in md
    # no encoder snapshots in this run: no scaling curve (tests/bert/test_pretrain_scaling.py)
    assert not (out / "pretrain_scaling.png").exists() and "by pretraining steps" not in md


@pytest.mark.parametrize("family", ["bert", "elmo", "skip_thought", "gpt"])
def test_every_vocabulary_stage_reports_its_unknown_rate(family_data, family):
    """Issue 39, defect 5: the share of the corpus's tokens (or words) each family's vocabulary cannot represent is in
    its stage.json, where a vocabulary too small for the corpus shows."""
    from tests.helpers import TINY_FAMILIES

    run = family_data(family)
    vocabulary_stage = TINY_FAMILIES[family].data_stages[1]
    summary = json.loads((run.stage_dir(vocabulary_stage) / "stage.json").read_text())
    assert 0 <= summary["unknown_rate"] <= 0.01 and summary["unknown_rate_warning"] is None


def test_a_corpus_of_copies_says_they_were_dropped_as_duplicates(tmp_path, ray_session):
    """Issue 39, defect 8: books that were all copies of one another got "needs at least 2 books; got 1", without a
    word of the others having been dropped as duplicates."""
    from pipeline.engine.dag import StageFailed
    from tests.helpers import write_books, write_sentiment_task

    write_books(tmp_path / "one", n_books=1)
    write_sentiment_task(tmp_path / "task")  # prepare decontaminates against its dev split
    (tmp_path / "books").mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / "books" / name).write_text((tmp_path / "one" / "book_00.txt").read_text())
    run = TinyRun(tiny_config(tmp_path, ["pipeline.until=bert_examples"]))
    for name in ("prepare", "bert_tokenizer"):
        run.run_stage(name)
    with pytest.raises(StageFailed, match=r"BERT's sentence pairs take a random next sentence from another book, so "
                                          r"the corpus needs at least 2 distinct books; prepare kept 1 of the 3 files, "
                                          r"dropping 2 as exact duplicates.*: b.txt, a copy of a.txt; c.txt, a copy of "
                                          r"a.txt \(every file's fate: \S+manifest.json\)"):
        run.run_stage("bert_examples")
