"""The fine-tune stage across task families, seeds aggregated as mean ± std, finished runs skipped on rerun."""
from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import lightning
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data_prep.corpus.tokenizer import encode_batch_ids, load_tokenizer, train_wordpiece
from models.bert import BertModel, bert_config, save_pretrained
from models.checkpoint import random_twin
from models.hf.bert import to_hf
from pipeline import CONF_DIR
from pipeline.downstream import finetune as finetuning
from pipeline.downstream import task_data
from pipeline.downstream.modules import FinetuneModule
from pipeline.downstream.tasks import load_task
from pipeline.engine.dag import StageContext, plain_config
from pipeline.engine.family import TokenCoverage
from pipeline.piece_vectors import PIECE_VECTORS_FILE
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, TinyRun, tiny_config, write_sentiment_task, write_stsb

WORDS = SUBJECTS + OBJECTS + POSITIVE + NEGATIVE + ["peter", "paris", "went", "to", "smith", "london"]


def _write_conll(root: Path) -> None:
    """CoNLL-2003 layout (IOB1). Dev is train's one sentence, with Paris left untagged in half the copies: a tagger
    that learned train predicts 12 entities, 9 of them gold, so precision 3/4, recall 1 and F1 6/7. Train repeats the
    sentence 48 times, 6 batches of 8, for one epoch to learn it."""
    root.mkdir(parents=True)
    sentence = "Peter NNP B-NP I-PER\nwent VBD B-VP O\nto TO B-PP O\nParis NNP B-NP {}\n"
    (root / "eng.train").write_text("-DOCSTART- -X- -X- O\n\n" + "\n".join([sentence.format("I-LOC")] * 48))
    (root / "eng.testa").write_text("-DOCSTART- -X- -X- O\n\n"
                                    + "\n".join([sentence.format("I-LOC"), sentence.format("O")] * 3))


def _write_piece_vectors(out: Path, tokenizer_dir: Path, pieces: list[str] | None = None) -> None:
    """A bert_piece_vectors output for the tokenizer in `tokenizer_dir`: a vector of bert_tiny's width for each of
    `pieces` (None: every piece of the vocabulary), NaN rows for the others, as pieces the corpus never shows get."""
    tok = load_tokenizer(tokenizer_dir)
    rows = list(range(tok.get_vocab_size())) if pieces is None else [tok.token_to_id(piece) for piece in pieces]
    vectors = np.full((tok.get_vocab_size(), 128), np.nan, dtype=np.float32)
    vectors[rows] = np.random.default_rng(0).normal(size=(len(rows), 128))
    out.mkdir(exist_ok=True)
    np.save(out / PIECE_VECTORS_FILE, vectors)


@pytest.fixture
def ctx(tmp_path) -> StageContext:
    return finetune_context(tmp_path)


def finetune_context(tmp_path: Path, experiment: str = "bert_tiny") -> StageContext:
    """The fine-tune stage's context under `experiment`'s settings: a tiny pretrained BERT, its tokenizer and piece
    vectors, and three small tasks (sst2, stsb, conll2003)."""
    tok_dir, pretrain_dir = tmp_path / "bert_tokenizer", tmp_path / "bert_pretrain"
    rng = random.Random(0)
    train_wordpiece([" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(300)], tok_dir, vocab_size=120,
                    min_frequency=1)
    # bert_tiny's pretraining starts from the piece vectors, which `bert` reads for its coverage of a task
    _write_piece_vectors(tmp_path / "bert_piece_vectors", tok_dir)
    save_pretrained(BertModel(bert_config("bert_tiny", vocab_size=128, max_position_embeddings=64)),
                    pretrain_dir / "encoder")
    glue = tmp_path / "glue"
    write_sentiment_task(glue / "SST-2", n_train=32, n_dev=16)
    write_stsb(glue / "STS-B")
    _write_conll(glue / "conll2003")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"+experiment={experiment}", f"paths.run_dir={tmp_path}", f"paths.cache_dir={tmp_path / 'cache'}",
            "logger=csv", "trainer.precision=32-true", "finetune.task=[sst2,stsb,conll2003]",
            f"finetune.data_dir={glue}", "finetune.models=[bert]", "finetune.seeds=[1,2]",
            # each test fine-tunes the kinds it names, and no others
            "finetune.random_twins=false", "finetune.controls=false",
            "finetune.baselines=[majority_class,bow_logreg]",  # no word2vec stage in these contexts
            "finetune.train_sizes=[null]", "finetune.min_steps=0",
            "finetune.epochs=1", "finetune.batch_size=8", "finetune.max_seq_length=16"])
    out = tmp_path / "finetune"
    out.mkdir()
    return StageContext(plain_config(cfg), "finetune", out, {"bert_tokenizer": tok_dir, "bert_pretrain": pretrain_dir,
                                                             "bert_piece_vectors": tmp_path / "bert_piece_vectors"})


def test_every_task_family_is_scored_with_its_metric_over_seeds_and_reruns_skip(ctx, monkeypatch, capsys):
    results = finetuning.finetune(ctx)["results"]
    by_key = {(r["model"], r["task"], r["metric"]): r for r in results}
    assert {k for k in by_key if k[0] == "bert"} == {
        ("bert", "sst2", "accuracy"), ("bert", "stsb", "pearson"), ("bert", "stsb", "spearman"),
        ("bert", "conll2003", "precision"), ("bert", "conll2003", "recall"),
        ("bert", "conll2003", "f1")}
    assert all(r["seeds"] == 2 for k, r in by_key.items() if k[0] == "bert")
    # classification: the most frequent label; tagging: each word's most frequent tag (a regression has none)
    assert {k for k in by_key if k[0] == "majority_class"} == {
        ("majority_class", "sst2", "accuracy"), ("majority_class", "conll2003", "precision"),
        ("majority_class", "conll2003", "recall"), ("majority_class", "conll2003", "f1")}
    assert not any(k[0] == "bow_logreg" and k[1] != "sst2" for k in by_key)  # TSV classification only
    bow = by_key[("bow_logreg", "sst2", "accuracy")]  # beats majority: test_baselines.py
    assert bow["train_examples"] == 32 and bow["seeds"] == 2  # on the models' subsets, every seed
    assert by_key[("bert", "sst2", "accuracy")]["dev_examples"] == 16
    # 3 tasks × 1 model × 2 seeds, and bow_logreg's 2 seeds
    assert len(list((ctx.out_dir / "finished").glob("*-seed*.json"))) == 8

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished (task, model, seed) was trained again")

    monkeypatch.setattr(finetuning, "finetune_once", must_not_train)
    again = finetuning.finetune(ctx)["results"]
    assert again == results
    assert capsys.readouterr().out.count("skipping") == 6


def test_fine_tuning_runs_print_their_results_without_lightnings_banners(ctx, monkeypatch, capfd, caplog):
    """Each (task, model, seed) builds its own Trainer: the console shows the pipeline's lines for it, not Lightning's
    device banner, its advertisements or its seed line, once per run."""
    import logging

    from pipeline.engine import training

    for name in training.LIGHTNING_BANNER_LOGGERS:  # as a fresh process has them, whatever ran before in this one
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    training.quiet_lightning_banners.cache_clear()
    caplog.set_level(logging.INFO)
    ctx.cfg.finetune.task = "sst2"
    finetuning.finetune(ctx)
    out, err = capfd.readouterr()
    console = out + err + caplog.text
    assert "finetune sst2/bert/all/seed1: accuracy" in out and "finetune sst2/bert/all/seed2" in out
    for banner in ("GPU available", "TPU available", "Tip", "Seed set to", "`Trainer.fit` stopped", "LeafSpec"):
        assert banner not in console, banner


def test_an_external_hf_bert_is_fine_tuned_with_its_own_tokenizer_in_the_same_table(ctx, tmp_path):
    external = tmp_path / "hf_bert"
    to_hf(BertModel(bert_config("bert_tiny", vocab_size=128, max_position_embeddings=64, num_hidden_layers=1)),
          external)
    ctx.cfg.finetune.models = ["bert", "bert_external"]
    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.external_encoder = str(external)
    with pytest.raises(FileNotFoundError, match="tokenizer"):  # weights alone are not enough
        finetuning.model_sources(ctx, finetuning.finetune_settings(ctx.cfg))
    shutil.copy(ctx.inputs["bert_tokenizer"] / "vocab.txt", external / "vocab.txt")
    rows = {(r["model"], r["metric"]) for r in finetuning.finetune(ctx)["results"]}
    assert {("bert", "accuracy"), ("bert_external", "accuracy"), ("majority_class", "accuracy"),
            ("bow_logreg", "accuracy")} == rows


def test_external_without_a_path_is_rejected(ctx):
    ctx.cfg.finetune.models = ["bert_external"]
    with pytest.raises(ValueError, match="finetune.external_encoder"):
        finetuning.model_sources(ctx, finetuning.finetune_settings(ctx.cfg))


@pytest.mark.parametrize("logger, files", [("csv", "csv_logs/**/metrics.csv"),
                                           ("tensorboard", "tensorboard/**/events.out.tfevents*")])
def test_training_stages_log_to_csv_or_tensorboard_without_wandb(ctx, logger, files):
    ctx.cfg.logger = OmegaConf.load(CONF_DIR / "logger" / f"{logger}.yaml")
    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.seeds = [1]
    finetuning.finetune(ctx)
    assert list(ctx.out_dir.glob(files))


def test_seeds_with_an_undefined_correlation_are_counted_not_averaged():
    rows = [{"model": "bert_random", "task": "stsb", "metric": "pearson", "score": s, "train_examples": 4,
             "dev_examples": 2, "seconds": 1.0} for s in (0.5, float("nan"), 0.7)]
    (row,) = finetuning._aggregate(rows)
    assert row["score"] == 0.6 and row["seeds"] == 2 and row["undefined_seeds"] == 1


def test_elmo_is_fine_tuned_feature_based_on_every_task_family(ctx, tmp_path):
    """finetune.models=[elmo]: the elmo_pretrain stage's frozen biLM with a fresh scalar mix and head per seed, the
    head reading the word2vec stage's vectors beside the mix, on classification, regression and tagging, each scored
    by its task's metric."""
    from conventions.elmo_words import SPECIAL_WORDS
    from data_prep.examples.elmo_examples import write_word_vocab
    from models import elmo
    from pipeline.downstream.finetune import finetune_upstream
    from pipeline.downstream.word2vec import VECTORS_FILE, WORDS_FILE

    vocab = [*SPECIAL_WORDS, *sorted(set(WORDS))]
    (tmp_path / "elmo_vocab").mkdir()
    write_word_vocab(vocab, tmp_path / "elmo_vocab" / "vocab.txt")
    tiny = dict(filters=[[1, 8], [2, 8]], projection_dim=16, lstm_dim=32)
    elmo.save_pretrained(elmo.BiLanguageModel(elmo.elmo_config("elmo_small", vocab_size=len(vocab), **tiny)),
                         tmp_path / "elmo" / "bilm")
    (tmp_path / "word2vec").mkdir()
    (tmp_path / "word2vec" / WORDS_FILE).write_text("\n".join(sorted(set(WORDS))))
    np.save(tmp_path / "word2vec" / VECTORS_FILE,
            np.random.default_rng(0).normal(size=(len(set(WORDS)), 8)).astype(np.float32))
    ctx.cfg.finetune.models = ["elmo", "bert"]
    assert set(finetune_upstream(ctx.cfg)) == {"bert_tokenizer", "bert_pretrain", "bert_piece_vectors", "elmo_vocab",
                                               "elmo_pretrain", "word2vec"}
    ctx.cfg.finetune.models = ["elmo"]
    assert finetune_upstream(ctx.cfg) == ("elmo_vocab", "elmo_pretrain", "word2vec")
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.lr = 2e-2  # one epoch (6 steps) learns the tagged sentence from 1e-2 to 3e-2, every seed tried
    ctx.inputs.update({"elmo_vocab": tmp_path / "elmo_vocab", "elmo_pretrain": tmp_path / "elmo",
                       "word2vec": tmp_path / "word2vec"})
    by_key = {(r["model"], r["task"], r["metric"]): r for r in finetuning.finetune(ctx)["results"]}
    assert {k for k in by_key if k[0] == "elmo"} == {
        ("elmo", "sst2", "accuracy"), ("elmo", "stsb", "pearson"), ("elmo", "stsb", "spearman"),
        ("elmo", "conll2003", "precision"), ("elmo", "conll2003", "recall"), ("elmo", "conll2003", "f1")}
    assert by_key[("elmo", "sst2", "accuracy")]["dev_examples"] == 16
    conll = {metric: by_key[("elmo", "conll2003", metric)]["score"] for metric in ("precision", "recall", "f1")}
    assert conll == pytest.approx({"precision": 0.75, "recall": 1.0, "f1": 6 / 7}, abs=1e-4)  # _write_conll

    # elmo_random: the same heads on the biLM's randomly initialised twin, encoded apart from the trained biLM's
    trained, twin = (finetuning.MODEL_KINDS[kind].load(ctx) for kind in ("elmo", "elmo_random"))
    assert finetuning.MODEL_KINDS["elmo"].random_twin == "elmo_random" and twin.encoding_key != trained.encoding_key
    expected = random_twin(elmo.load_pretrained(tmp_path / "elmo" / "bilm"), ctx.cfg.seed).state_dict()
    assert twin.bilm.state_dict().keys() == expected.keys()
    assert all(torch.equal(twin.bilm.state_dict()[k], expected[k]) for k in expected)
    assert not torch.equal(twin.bilm.state_dict()["token_encoder.char_embedding.weight"],
                           trained.bilm.state_dict()["token_encoder.char_embedding.weight"])


def test_train_sizes_draw_stratified_subsets_deterministic_per_seed():
    labels = [0] * 70 + [1] * 30
    first = finetuning.stratified_subsample(labels, 10, 100, np.random.default_rng([1, 10]))
    assert first.tolist() == finetuning.stratified_subsample(labels, 10, 100, np.random.default_rng([1, 10])).tolist()
    other = finetuning.stratified_subsample(labels, 10, 100, np.random.default_rng([2, 10]))
    assert first.tolist() != other.tolist()
    for subset in (first, other):
        assert len(set(subset.tolist())) == 10 and np.bincount(np.array(labels)[subset]).tolist() == [7, 3]
    # largest remainder: 7 of a 70/30 split is 4.9 + 2.1 -> 5 + 2
    assert np.bincount(np.array(labels)[finetuning.stratified_subsample(labels, 7, 100,
                                                                         np.random.default_rng(0))]).tolist() == [5, 2]
    assert finetuning.stratified_subsample(labels, None, 100, np.random.default_rng(0)).tolist() == list(range(100))
    assert finetuning.stratified_subsample(labels, 500, 100, np.random.default_rng(0)).tolist() == list(range(100))
    unlabelled = finetuning.stratified_subsample(None, 10, 100, np.random.default_rng(0))  # regression, tagging
    assert len(set(unlabelled.tolist())) == 10


def _kinds(ctx) -> list[str]:
    return list(finetuning.finetune_kinds(ctx.cfg, finetuning.finetune_settings(ctx.cfg)))


def test_each_pretrained_kind_is_fine_tuned_beside_its_random_twin(ctx):
    ctx.cfg.finetune.random_twins = True  # the default (pipeline/config.py)
    ctx.cfg.pretrain.init_embeddings = "random"  # where the random twin is BERT's control too

    ctx.cfg.finetune.models = ["gpt", "bert", "bert_external", "elmo_random"]
    assert _kinds(ctx) == ["gpt", "gpt_random", "bert", "bert_random", "bert_external", "elmo_random"]
    ctx.cfg.finetune.models = ["bert_random", "bert"]  # listed already: once, where the user put it
    assert _kinds(ctx) == ["bert_random", "bert"]
    ctx.cfg.finetune.random_twins = False
    ctx.cfg.finetune.models = ["gpt", "bert"]
    assert _kinds(ctx) == ["gpt", "bert"]


def test_a_bert_pretrained_from_the_piece_vectors_is_fine_tuned_beside_its_control_without_pretraining(ctx):
    """bert_tiny's pretraining starts from the piece vectors: its control bert_w2v (that start, no pretraining steps)
    comes with `bert` like the random twin, unless finetune.controls=false; from random initialisation the twin is the
    control, fine-tuned once, and a continued pretraining has none."""
    ctx.cfg.finetune.random_twins = ctx.cfg.finetune.controls = True  # the defaults (pipeline/config.py)
    ctx.cfg.finetune.models = ["bert", "gpt"]
    # GPT reads `pretrain` too where gpt.pretrain leaves init_embeddings null: it starts from its own piece vectors
    assert _kinds(ctx) == ["bert", "bert_random", "bert_w2v", "gpt", "gpt_random", "gpt_w2v"]
    assert finetuning.controls_in_run(ctx.cfg, finetuning.finetune_kinds(
        ctx.cfg, finetuning.finetune_settings(ctx.cfg))) == {"bert": "bert_w2v", "gpt": "gpt_w2v"}
    # it reads the piece vectors and the tokenizer, and waits for no pretraining step
    assert set(finetuning.finetune_upstream(ctx.cfg)) >= {"bert_pretrain", "bert_piece_vectors"}
    ctx.cfg.finetune.models = ["bert_w2v"]
    assert finetuning.finetune_upstream(ctx.cfg) == ("bert_tokenizer", "bert_piece_vectors")
    ctx.cfg.finetune.models = ["bert_w2v", "bert"]  # listed already: once, where the user put it
    assert _kinds(ctx) == ["bert_w2v", "bert", "bert_random"]
    ctx.cfg.finetune.models = ["bert"]
    ctx.cfg.finetune.random_twins = False
    assert _kinds(ctx) == ["bert", "bert_w2v"]
    ctx.cfg.finetune.controls = False
    assert _kinds(ctx) == ["bert"]

    ctx.cfg.finetune.random_twins = ctx.cfg.finetune.controls = True
    ctx.cfg.pretrain.init_embeddings = "random"
    kinds = finetuning.finetune_kinds(ctx.cfg, finetuning.finetune_settings(ctx.cfg))
    assert list(kinds) == ["bert", "bert_random"] and finetuning.controls_in_run(ctx.cfg, kinds) == {
        "bert": "bert_random"}
    ctx.cfg.finetune.random_twins = False  # the twin comes with finetune.random_twins, control or not
    assert _kinds(ctx) == ["bert"]
    ctx.cfg.finetune.random_twins = True
    ctx.cfg.pretrain.update(init_embeddings="word2vec", init_from=str(ctx.inputs["bert_pretrain"]))
    kinds = finetuning.finetune_kinds(ctx.cfg, finetuning.finetune_settings(ctx.cfg))
    assert list(kinds) == ["bert", "bert_random"] and finetuning.controls_in_run(ctx.cfg, kinds) == {}


@pytest.mark.parametrize("continued", [False, True])
def test_bert_w2v_is_refused_where_pretraining_does_not_start_from_the_piece_vectors(continued, tmp_path):
    from pipeline.runner import validate

    checkpoint = tmp_path / "hf_bert"
    to_hf(BertModel(bert_config("bert_tiny", vocab_size=128, max_position_embeddings=128)), checkpoint)
    # a checkpoint init_from accepts: its tokenizer beside the weights
    (checkpoint / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                    + [f"w{i}" for i in range(123)]) + "\n")
    override, control = ((f"pretrain.init_from={checkpoint}", "no kind") if continued else
                         ("pretrain.init_embeddings=random", "bert_random"))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=bert_tiny", f"paths.run_dir={tmp_path}",
                                                        "finetune.models=[bert,bert_w2v]", override])
    with pytest.raises(ValueError, match=f"finetune.models has bert_w2v, .* in this run {control} is bert's control; "
                                         "remove bert_w2v from finetune.models"):
        validate(cfg)


def test_small_train_sizes_get_at_least_min_steps():
    assert finetuning.finetune_epochs(epochs=3, min_steps=0, steps_per_epoch=4) == 3
    assert finetuning.finetune_epochs(epochs=3, min_steps=100, steps_per_epoch=4) == 25
    assert finetuning.finetune_epochs(epochs=3, min_steps=100, steps_per_epoch=300) == 3


def test_a_tasks_min_steps_is_a_floor_beside_finetune_min_steps_and_a_bad_one_fails(ctx):
    """tasks/conll2003.yaml's min_steps: bert_tiny's tagger trailed its twin at finetune.min_steps' 160 steps."""
    from omegaconf import OmegaConf

    from pipeline.downstream.tasks import task_min_steps

    ctx.cfg.finetune.task = ["sst2", "conll2003"]
    ctx.cfg.finetune.seeds = [1]
    finetuning.finetune(ctx)
    last_step = {task: int(np.loadtxt(next((ctx.out_dir / "csv_logs" / task / "bert").glob("*/seed1/metrics.csv")),
                                      delimiter=",", skiprows=1, usecols=1, dtype=str, ndmin=1)[-1])
                 for task in ("sst2", "conll2003")}
    assert last_step == {"sst2": 3, "conll2003": 599}  # 1 epoch of 4 batches; 100 of 6, the task's 600 steps
    assert task_min_steps(load_task("conll2003_pos")) == 600 and task_min_steps(load_task("sst2")) == 0
    for bad in (-1, 1.5, "600", True):
        with pytest.raises(ValueError, match="min_steps .* is not a number of steps"):
            task_min_steps(OmegaConf.create({"name": "conll2003", "min_steps": bad}))


def test_train_sizes_give_a_label_efficiency_curve_in_the_report(ctx, tmp_path):
    from pipeline.report.report import write_report

    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.models = ["bert", "bert_random"]
    ctx.cfg.finetune.train_sizes = [8, 16, None]
    results = finetuning.finetune(ctx)["results"]
    # the stage's summary is the headline table: all the data
    assert {(r["model"], r["train_size"], r["train_examples"]) for r in results} == {
        ("bert", None, 32), ("bert_random", None, 32), ("majority_class", None, 32), ("bow_logreg", None, 32)}
    stored = json.loads((ctx.out_dir / "results.json").read_text())
    curve = finetuning.label_efficiency(stored)
    assert sorted({(r["model"], r["train_examples"], r["seeds"]) for r in curve}) == [
        (kind, n, 2) for kind in ("bert", "bert_random", "bow_logreg") for n in (8, 16, 32)]
    # the same examples for both model kinds and the baseline at one size and seed: the subsets differ by seed and
    # size only
    assert len(list((ctx.out_dir / "finished").glob("sst2-*-8-seed*.json"))) == 6
    out = tmp_path / "report"
    out.mkdir()
    paths = write_report({"finetune": ctx.out_dir}, out, "unit")
    assert paths["label_efficiency_plot"].stat().st_size > 1000
    md = paths["results_md"].read_text()
    assert "## Label efficiency" in md and "| model | 8 | 16 | 32 |" in md
    # the headline table shows all-data rows only
    assert md.count("| bert ([UNK] 0.0% of the task's tokens; piece vectors cover 100%) | sst2 | accuracy |") == 1
    assert md.count("| bow_logreg | sst2 | accuracy |") == 1


def test_sizes_at_or_above_the_train_split_run_once_as_all_and_the_csv_says_which_size(ctx, tmp_path, capsys):
    """Issue 39, defect 3: sizes of 32 and 100 on a train split of 32 each gave a copy of the all-data run, whose
    label-efficiency cells (keyed by train examples) overwrote one another, and results.csv had no train_size."""
    import csv

    from pipeline.report.report import write_report

    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.train_sizes = [16, 32, 100, None]
    finetuning.finetune(ctx)
    assert sorted(p.name for p in (ctx.out_dir / "finished").glob("sst2-bert-*.json")) == [
        "sst2-bert-16-seed1.json", "sst2-bert-all-seed1.json"]
    assert "finetune.train_sizes 32, 100 are at least the 32 training examples of task sst2" in capsys.readouterr().out
    stored = json.loads((ctx.out_dir / "results.json").read_text())
    assert sorted((r["train_size"] or 0, r["train_examples"]) for r in stored if r["model"] == "bert") == [
        (0, 32), (16, 16)]
    out = tmp_path / "report"
    out.mkdir()
    with open(write_report({"finetune": ctx.out_dir}, out, "unit")["results_csv"]) as f:
        rows = list(csv.DictReader(f))
    # the subset baselines at the model kinds' sizes: 32 and 100 are "all" for them too, not copies of it
    assert {(r["model"], r["train_size"]) for r in rows} == {
        ("bert", "16"), ("bert", "all"), ("majority_class", "all"), ("bow_logreg", "16"),
        ("bow_logreg", "all")}


@pytest.mark.parametrize("override, message", [
    ("finetune.seeds=[1,1]", "finetune.seeds=[1, 1] repeats [1]: a seed gives the same run every time"),
    ("finetune.seeds=[]", "finetune.seeds=[]: fine-tuning needs at least one seed"),
    ("finetune.train_sizes=[100,null,100]", "finetune.train_sizes=[100, None, 100] repeats [100]"),
])
def test_repeated_or_no_seeds_and_repeated_sizes_fail_at_start_up(override, message, tmp_path):
    """Issue 39, defect 3: finetune.seeds=[1,1] trained seed 1 once and counted it twice (0.5000 ± 0.0000 | 2, 'ahead
    on 0 of 2 seeds'); finetune.seeds=[] gave a table of baselines alone, exit 0."""
    from pipeline.runner import validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=bert_tiny", f"paths.run_dir={tmp_path}", override])
    with pytest.raises(ValueError, match=re.escape(message)):
        validate(cfg)


def test_bad_train_sizes_are_refused_before_any_work(ctx):
    ctx.cfg.finetune.train_sizes = [100, 0]
    with pytest.raises(ValueError, match="finetune.train_sizes"):
        finetuning.train_sizes(finetuning.finetune_settings(ctx.cfg))


def test_selection_fraction_scores_a_held_out_part_of_train_instead_of_dev(ctx, tmp_path):
    from pipeline.downstream.task_data import split_off
    from pipeline.downstream.tasks import TaskSplit
    from pipeline.report.report import write_report

    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.selection_fraction = 0.25
    rows = finetuning.finetune(ctx)["results"]
    assert {(r["train_examples"], r["dev_examples"], r["scored_on"]) for r in rows} == {(24, 8, "train_holdout")}
    rest, held_out = split_off(TaskSplit(list("abcdefgh"), None, list(range(8))), 0.25, 1)
    assert len(held_out.labels) == 2 and sorted(rest.labels + held_out.labels) == list(range(8))
    out = tmp_path / "report"
    out.mkdir()
    md = write_report({"finetune": ctx.out_dir}, out, "unit")["results_md"].read_text()
    assert "not the dev set" in md


def test_selection_fraction_holds_out_a_tagging_tasks_train_sentences_and_never_reads_its_dev_file(ctx, tmp_path):
    """A CoNLL task was refused with selection_fraction (zh_pos's selection split was made by hand): its settings could
    only be chosen on the dev set they are reported on."""
    ctx.cfg.finetune.task = "conll2003"
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.selection_fraction = 0.25
    (Path(ctx.cfg.finetune.data_dir) / "conll2003" / "eng.testa").unlink()  # read, it would fail
    rows = finetuning.finetune(ctx)["results"]
    assert {(r["train_examples"], r["dev_examples"], r["scored_on"]) for r in rows} == {(36, 12, "train_holdout")}
    task = load_task("conll2003")
    train, held_out = task_data.conll_splits(task, Path(ctx.cfg.finetune.data_dir) / "conll2003", None, 1, 0.25)
    again, _ = task_data.conll_splits(task, Path(ctx.cfg.finetune.data_dir) / "conll2003", 10, 1, 0.25)
    assert (len(train), len(held_out), len(again)) == (36, 12, 10)


def test_selection_fraction_refuses_a_squad_task_saying_what_to_do_before_any_work(ctx):
    ctx.cfg.finetune.task = "squad_v1"
    ctx.cfg.finetune.selection_fraction = 0.25
    with pytest.raises(ValueError, match="task squad_v1 is squad: leave it null"):
        finetuning.finetune(ctx)
    with pytest.raises(ValueError, match="task squad_v1 is squad: leave it null"):
        finetuning.check_task_files(ctx.cfg)  # at start-up (pipeline.runner.validate), not after pretraining


def test_length_grouped_batches_cover_every_example_once_in_random_order_and_pad_little():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 65, size=1000)
    batches = task_data.length_grouped_batches(lengths, 32, np.random.default_rng(1),
                                                                    pool_batches=10)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert [len(b) for b in batches].count(32) == len(batches) - 1  # only the last pool's last batch is short
    again = task_data.length_grouped_batches(lengths, 32, np.random.default_rng(1), pool_batches=10)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))  # a function of its rng

    def padded(batches):
        return sum(lengths[b].max() * len(b) for b in batches)

    shuffled = np.random.default_rng(1).permutation(1000)
    random_batches = [shuffled[i:i + 32] for i in range(0, 1000, 32)]
    assert padded(batches) < 0.7 * padded(random_batches)
    assert padded(batches) < 1.15 * lengths.sum()  # random: 1.6x
    # the batches come in random order, not from short to long
    maxima = [lengths[b].max() for b in batches]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)
    sampler = task_data.LengthGroupedBatchSampler(lengths, 32, seed=1)
    first, second = list(sampler), list(sampler)
    assert len(sampler) == len(first) == 32 and first != second  # a new draw each epoch


def test_fine_tuning_batches_sentences_of_similar_length_when_asked(ctx, tmp_path, monkeypatch):
    from dataclasses import replace

    from pipeline.bert import downstream as bert_downstream

    rng = random.Random(0)
    task_dir = tmp_path / "varied" / "SST-2"
    task_dir.mkdir(parents=True)
    rows = ["sentence\tlabel"]
    for _ in range(64):
        label = rng.randint(0, 1)
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
        rows.append(" ".join(words + [rng.choice(POSITIVE if label else NEGATIVE)]) + f"\t{label}")
    (task_dir / "train.tsv").write_text("\n".join(rows) + "\n")
    (task_dir / "dev.tsv").write_text("\n".join(rows[:6]) + "\n")  # 5 sentences: one dev batch, told apart by size
    pad = bert_downstream.pad_classification_batch
    batches = []

    def recording(batch_rows, *args, **kwargs):
        if len(batch_rows) == 8:  # a training batch (finetune.batch_size=8): one epoch of 64 sentences is 8 of them
            batches[-1].append([len(r["input_ids"]) for r in batch_rows])
        return pad(batch_rows, *args, **kwargs)

    monkeypatch.setattr(bert_downstream, "pad_classification_batch", recording)
    ctx.cfg.finetune.update(task="sst2", data_dir=str(tmp_path / "varied"), seeds=[1])
    padding, spread = {}, {}
    for grouped in (True, False):
        ctx.cfg.finetune.group_by_length = grouped
        batches.append([])
        out = tmp_path / f"finetune-{grouped}"
        out.mkdir()
        finetuning.finetune(replace(ctx, out_dir=out))
        assert len(batches[-1]) == 8 and sum(len(b) for b in batches[-1]) == 64
        padding[grouped] = sum(max(b) * len(b) - sum(b) for b in batches[-1])
        spread[grouped] = sum(max(b) - min(b) for b in batches[-1])
    assert sorted(sum(batches[0], [])) == sorted(sum(batches[1], []))  # the same sentences
    # one pool of 64 cut in length order: the 8 batches' ranges add up to at most the range of all lengths
    assert spread[True] <= max(sum(batches[0], [])) - min(sum(batches[0], [])) < spread[False]
    assert padding[True] < 0.5 * padding[False]


def test_layer_depths_and_rates_run_from_the_embeddings_to_the_top_for_bert_and_gpt():
    from models.gpt import GPTModel, gpt_config
    from pipeline.downstream.modules import encoder_lr_scales, layer_depths

    bert = BertModel(bert_config("bert_tiny", vocab_size=64, max_position_embeddings=16))  # 2 layers
    depths = layer_depths(bert)
    assert depths["embeddings.word_embeddings.weight"] == 0
    assert depths["encoder.layer.0.attention.self.query.weight"] == 1
    assert depths["encoder.layer.1.output.dense.bias"] == 2 and depths["pooler.dense.weight"] == 3
    scales = encoder_lr_scales(bert, 0.5, 0.8)
    parameters = dict(bert.named_parameters())
    assert scales[id(parameters["pooler.dense.weight"])] == pytest.approx(0.5)
    assert scales[id(parameters["encoder.layer.1.output.dense.bias"])] == pytest.approx(0.5 * 0.8)
    assert scales[id(parameters["embeddings.word_embeddings.weight"])] == pytest.approx(0.5 * 0.8 ** 3)
    assert encoder_lr_scales(bert, 1.0, 1.0) == {}  # the defaults change nothing
    gpt = GPTModel(gpt_config("gpt_tiny", vocab_size=64, n_positions=16))
    gpt_depths = layer_depths(gpt)
    assert gpt_depths["wte.weight"] == 0 and gpt_depths["h.1.mlp.c_fc.weight"] == 2 and gpt_depths["ln_f.weight"] == 3


def test_frozen_embeddings_stay_and_a_linear_probe_trains_the_head_before_the_encoder(ctx, monkeypatch):
    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.models = ["bert", "bert_random"]
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.freeze_embeddings = "all"
    ctx.cfg.finetune.linear_probe_epochs = 2
    fits = []
    real_fit = lightning.Trainer.fit

    def recording_fit(trainer, module, *args, **kwargs):
        encoder = module.model.encoder
        before = {name: p.detach().clone() for name, p in encoder.named_parameters()}
        head = {name: p.detach().clone() for name, p in module.model.named_parameters() if not name.startswith("bert.")}
        real_fit(trainer, module, *args, **kwargs)
        fits.append(({name for name, p in encoder.named_parameters() if not torch.equal(p, before[name])},
                     any(not torch.equal(p, head[name]) for name, p in module.model.named_parameters()
                         if name in head)))

    monkeypatch.setattr(lightning.Trainer, "fit", recording_fit)
    settings = finetuning.finetune_settings(ctx.cfg)
    task, sources = load_task("sst2"), finetuning.model_sources(ctx, settings)
    models = sources["bert"][0]
    data = models.encode(task, Path(settings.data_dir) / "SST-2", settings, 0, None)
    finetuning.finetune_once(ctx, settings, task, data, models, "bert", 1, np.arange(len(data.train)))
    (probe_moved, probe_head), (tune_moved, tune_head) = fits
    assert probe_moved == set() and probe_head  # the probe trained the head alone
    assert tune_head and tune_moved and "embeddings.word_embeddings.weight" not in tune_moved  # then the encoder
    fits.clear()  # the random twin has nothing to keep: its embeddings train
    twin = sources["bert_random"][0]
    twin_data = twin.encode(task, Path(settings.data_dir) / "SST-2", settings, 0, None)
    finetuning.finetune_once(ctx, settings, task, twin_data, twin, "bert_random", 1, np.arange(len(twin_data.train)))
    assert "embeddings.word_embeddings.weight" in fits[-1][0]


def test_with_vector_keeps_the_rows_that_have_a_piece_vector_and_trains_the_others(ctx, monkeypatch):
    """finetune.freeze_embeddings=with_vector: the rows of `bert`'s and its control's word embeddings that started
    from a piece vector stay bit for bit (weight decay included), the rows of the task's pieces without one train
    (pieces the corpus shows too rarely for skip-gram, at their random initialisation); the twin trains every row."""
    tok = load_tokenizer(ctx.inputs["bert_tokenizer"])
    _write_piece_vectors(ctx.inputs["bert_piece_vectors"], ctx.inputs["bert_tokenizer"],
                         [piece for piece, i in tok.get_vocab().items() if i % 2 == 0])  # even ids have a vector
    ctx.cfg.finetune.task = "sst2"
    ctx.cfg.finetune.seeds = [1]
    ctx.cfg.finetune.random_twins = ctx.cfg.finetune.controls = True
    ctx.cfg.finetune.freeze_embeddings = "with_vector"
    ctx.cfg.finetune.epochs = 3
    tables = []
    real_fit = lightning.Trainer.fit

    def recording_fit(trainer, module, *args, **kwargs):
        words = module.model.encoder.embeddings.word_embeddings.weight
        before = words.detach().clone()
        real_fit(trainer, module, *args, **kwargs)
        tables.append((before, words.detach().clone()))

    monkeypatch.setattr(lightning.Trainer, "fit", recording_fit)
    settings = finetuning.finetune_settings(ctx.cfg)
    task, sources = load_task("sst2"), finetuning.model_sources(ctx, settings)
    assert sorted(sources) == ["bert", "bert_random", "bert_w2v"]
    moved = {}
    for kind in ("bert", "bert_w2v", "bert_random"):
        models = sources[kind][0]
        data = models.encode(task, Path(settings.data_dir) / "SST-2", settings, 0, None)
        finetuning.finetune_once(ctx, settings, task, data, models, kind, 1, np.arange(len(data.train)))
        before, after = tables[-1]
        seen = torch.from_numpy(np.unique(np.concatenate([np.asarray(x["input_ids"]) for x in data.train])))
        moved[kind] = {int(i) for i in seen if not torch.equal(before[i], after[i])}
        if kind != "bert_random":
            kept = torch.arange(0, len(before), 2)
            assert torch.equal(after[kept], before[kept])  # every row with a vector, bit for bit
    without = {int(i) for i in np.unique(np.concatenate([np.asarray(x["input_ids"]) for x in data.train])) if i % 2}
    assert without and moved["bert"] == moved["bert_w2v"] == without  # and every row of the task without one trained
    assert moved["bert_random"] > without  # the twin trains every row the task shows


def learning_rates(ctx: StageContext, monkeypatch, kinds: list[str]) -> dict[str, list[float]]:
    """Model kind -> the distinct learning rates of the optimizer its fine-tuning on sst2 builds (nothing trains)."""
    ctx.cfg.finetune.task, ctx.cfg.finetune.models = "sst2", kinds
    rates, building = {}, []

    def recording_fit(trainer, module, *args, **kwargs):
        optimizer = module.configure_optimizers()["optimizer"]
        rates[building[-1]] = sorted({group["lr"] for group in optimizer.param_groups})

    monkeypatch.setattr(lightning.Trainer, "fit", recording_fit)
    settings = finetuning.finetune_settings(ctx.cfg)
    task, sources = load_task("sst2"), finetuning.model_sources(ctx, settings)
    for kind in kinds:
        building.append(kind)
        models = sources[kind][0]
        data = models.encode(task, Path(settings.data_dir) / "SST-2", settings, 0, None)
        finetuning.finetune_once(ctx, settings, task, data, models, kind, 1, np.arange(len(data.train)))
    return rates


def test_discriminative_rates_slow_the_pretrained_encoder_and_leave_its_random_twin_alone(ctx, monkeypatch):
    """finetune.encoder_lr_factor and layer_lr_decay keep what pretraining learned; a random twin has nothing to keep,
    and slowed random layers would handicap it: it trains every layer at the head's rate."""
    ctx.cfg.finetune.encoder_lr_factor, ctx.cfg.finetune.layer_lr_decay = 0.5, 0.5
    rates = learning_rates(ctx, monkeypatch, ["bert", "bert_random"])
    pretrained, twin = rates["bert"], rates["bert_random"]
    lr = ctx.cfg.finetune.lr
    # the head at lr; the pooler/top at 0.5 lr, layer 1 at 0.25, layer 0 at 0.125, the embeddings at 0.0625
    assert pretrained == pytest.approx(sorted({lr, lr * 0.5, lr * 0.25, lr * 0.125, lr * 0.0625}))
    assert twin == [lr]


def test_bert_tiny_zh_fine_tunes_every_layer_of_its_pretrained_encoder_at_the_heads_rate(tmp_path, monkeypatch):
    """bert_tiny_zh's finetune.layer_lr_decay 1.0 reaches the optimizer: its pretrained encoder and its control train
    every layer at the head's rate, where bert_tiny's 0.5 slows each layer below the top (docs/chinese.md, "A task in
    traditional characters, read in the corpus's form")."""
    (tmp_path / "zh").mkdir(), (tmp_path / "en").mkdir()
    zh = finetune_context(tmp_path / "zh", "bert_tiny_zh")
    lr = zh.cfg.finetune.lr
    assert learning_rates(zh, monkeypatch, ["bert", "bert_w2v"]) == {"bert": [lr], "bert_w2v": [lr]}
    # the same recording sees bert_tiny's decay, so the single rate above is the setting's, not the recording's
    assert len(learning_rates(finetune_context(tmp_path / "en"), monkeypatch, ["bert"])["bert"]) > 1


def test_a_run_without_model_kinds_gives_the_baselines_alone(tmp_path):
    """finetune.models=[] with TSV baselines failed in the stage with a bare StopIteration."""
    run = TinyRun(tiny_config(tmp_path, ["finetune.models=[]", "finetune.baselines=[majority_class,bow_logreg]",
                                         "finetune.train_sizes=[20,null]", "pipeline.stages=[finetune]"]))
    run.run_stage("finetune")
    results = json.loads((run.stage_dir("finetune") / "results.json").read_text())
    assert sorted((row["model"], str(row["train_size"])) for row in results) == [
        ("bow_logreg", "20"), ("bow_logreg", "None"), ("majority_class", "None")]
    assert {row["train_examples"] for row in results if row["train_size"] is None} == {160}


def test_a_word2vec_baseline_that_covers_too_few_of_the_tasks_words_says_so_beside_its_row(ctx, tmp_path, capsys):
    """A corpus of rare words left word2vec the vocabulary ['.']: w2v_mean was the mean of no word, zeros, and scored
    like a real baseline. Its rows carry the share of the task's words it covers, and below
    finetune.w2v_min_coverage the stage and the report's table say it is no real baseline."""
    from pipeline.report.report import write_report

    word2vec = tmp_path / "word2vec"
    word2vec.mkdir()
    (word2vec / "words.txt").write_text(".")
    np.save(word2vec / "vectors.npy", np.ones((1, 4), dtype=np.float32))
    ctx.inputs["word2vec"] = word2vec
    ctx.cfg.finetune.task, ctx.cfg.finetune.seeds, ctx.cfg.finetune.baselines = "sst2", [1], ["w2v_mean"]
    rows = [r for r in finetuning.finetune(ctx)["results"] if r["model"] == "w2v_mean"]
    warning = ("w2v_mean covers 0.0% of the words of task sst2, below finetune.w2v_min_coverage=0.5: its features are "
               "the mean of a few words of a sentence, or zeros, so its score is not what word2vec learned (its "
               "vocabulary: 1); pretrain on more text (or text nearer the task), or lower word2vec.min_count")
    assert [(r["coverage"], r["coverage_warning"]) for r in rows] == [(0.0, warning)]
    assert f"WARNING: {warning}" in capsys.readouterr().out
    assert not any("coverage" in r for r in json.loads((ctx.out_dir / "results.json").read_text())
                   if r["model"] != "w2v_mean")
    (tmp_path / "report").mkdir()
    md = write_report({"finetune": ctx.out_dir}, tmp_path / "report", "unit")["results_md"].read_text()
    assert "| w2v_mean (covers 0% of the task's words; BELOW finetune.w2v_min_coverage: not a real baseline) | sst2 |" \
        in md
    assert f"**WARNING**: {warning}" in md


# words that are one piece each of the fixture's tokenizer
ONE_PIECE = ["great", "wonderful", "funny", "brilliant", "bad", "captain", "doctor", "man"]


def _write_two_word_sst2(ctx, first_words: list[str], second_words: list[str]) -> None:
    """The fixture's SST-2 rewritten as every sentence of one of `first_words` then one of `second_words`, train and
    dev alike, labelled by the first word (alternately 0 and 1)."""
    rows = [f"{first} {second}\t{i % 2}" for i, first in enumerate(first_words) for second in second_words]
    for name in ("train.tsv", "dev.tsv"):
        (Path(ctx.cfg.finetune.data_dir) / "SST-2" / name).write_text("\n".join(["sentence\tlabel", *rows]) + "\n")


def _report(ctx, tmp_path) -> str:
    from pipeline.report.report import write_report

    (tmp_path / "report").mkdir()
    return write_report({"finetune": ctx.out_dir}, tmp_path / "report", "unit")["results_md"].read_text()


def test_piece_vectors_that_miss_half_the_tasks_tokens_are_reported_beside_the_kinds_that_start_from_them(
        ctx, tmp_path, capsys):
    """bert_tiny's word embeddings start from the piece vectors, and a piece without one keeps its random
    initialisation (frozen, where the embeddings are): `bert` and its control then fine-tune on noise for the task's
    pieces the corpus never showed. Their rows carry the share of the task's tokens that have a vector, and below
    finetune.w2v_min_coverage the stage and the report say so; bert_random starts from no vectors."""
    with_vectors, without = ONE_PIECE[:4], ONE_PIECE[4:]
    _write_two_word_sst2(ctx, with_vectors, without)
    tokenizer_dir = ctx.inputs["bert_tokenizer"]
    assert all(len(ids) == 1 for ids in encode_batch_ids(load_tokenizer(tokenizer_dir), ONE_PIECE))
    _write_piece_vectors(ctx.inputs["bert_piece_vectors"], tokenizer_dir, with_vectors)
    ctx.cfg.finetune.update(task="sst2", seeds=[1], baselines=["majority_class"], random_twins=True, controls=True,
                            w2v_min_coverage=0.6)
    rows = {r["model"]: r for r in finetuning.finetune(ctx)["results"]}
    half = {"unknown_token": "[UNK]", "unknown_rate": 0.0, "high_unknown_rate": False, "vectors": "piece vectors",
            "vector_coverage": 0.5, "low_vector_coverage": True}
    assert {model: row.get("token_coverage") for model, row in rows.items()} == {
        "bert": half, "bert_w2v": half, "majority_class": None,
        "bert_random": {"unknown_token": "[UNK]", "unknown_rate": 0.0, "high_unknown_rate": False}}
    warnings = {kind: (f"{kind}'s word embeddings start from piece vectors that cover 50.0% of the tokens of task "
                       "sst2, below finetune.w2v_min_coverage=0.6: the others start from random rows, so the row "
                       "measures what the corpus shares with the task more than the piece vectors; pretrain on more "
                       "text, or text nearer the task's") for kind in ("bert", "bert_w2v")}
    assert {model: row.get("coverage_warning") for model, row in rows.items() if "coverage_warning" in row} == warnings
    out = capsys.readouterr().out
    assert all(f"WARNING: {warning}" in out for warning in warnings.values())
    md = _report(ctx, tmp_path)
    for kind in ("bert", "bert_w2v"):
        assert (f"| {kind} ([UNK] 0.0% of the task's tokens; piece vectors cover 50%, BELOW "
                f"finetune.w2v_min_coverage) | sst2 | accuracy |") in md
        assert f"**WARNING**: {warnings[kind]}" in md
    assert "| bert_random ([UNK] 0.0% of the task's tokens) | sst2 | accuracy |" in md

    ctx.cfg.finetune.w2v_min_coverage = 0.5  # half is not below half: the rerun, from finished/, marks nothing
    rows = finetuning.finetune(ctx)["results"]
    assert {r["model"]: r["token_coverage"]["low_vector_coverage"] for r in rows if "vectors" in
            r.get("token_coverage", {})} == {"bert": False, "bert_w2v": False}
    assert not any("coverage_warning" in r for r in rows) and "WARNING" not in capsys.readouterr().out


def test_a_task_in_characters_the_tokenizer_lacks_reports_its_unknown_rate(ctx, tmp_path, capsys):
    """The fixture's tokenizer knows the letters of English words: a Greek word is one [UNK] to it, so half the
    tokens of sentences of a known word and a Greek one are [UNK], and the model reads the task without its words.
    The rows say so, and above finetune.max_unknown_rate the stage and the report warn."""
    _write_two_word_sst2(ctx, ONE_PIECE, ["βασιλιάς", "ωκεανός"])
    ctx.cfg.finetune.update(task="sst2", seeds=[1], baselines=["majority_class"])
    rows = {r["model"]: r for r in finetuning.finetune(ctx)["results"]}
    assert rows["bert"]["token_coverage"] == {
        "unknown_token": "[UNK]", "unknown_rate": 0.5, "high_unknown_rate": True, "vectors": "piece vectors",
        "vector_coverage": 1.0, "low_vector_coverage": False}
    warning = ("50.0% of the tokens of task sst2 are [UNK] to bert's tokenizer, above finetune.max_unknown_rate=0.05: "
               "the tokenizer does not cover the task's script or register, and bert reads those words as one "
               "token; train the tokenizer (pretrain) on text in the task's script and register")
    assert rows["bert"]["coverage_warning"] == warning
    assert f"WARNING: {warning}" in capsys.readouterr().out
    md = _report(ctx, tmp_path)
    assert ("| bert ([UNK] 50.0% of the task's tokens, ABOVE finetune.max_unknown_rate; piece vectors cover 100%) "
            "| sst2 | accuracy |") in md
    assert f"**WARNING**: {warning}" in md


@pytest.mark.parametrize("key", ["w2v_min_coverage", "max_unknown_rate"])
def test_the_coverage_bounds_are_shares_checked_at_start_up(ctx, key):
    from pipeline.config import Config
    from pipeline.engine.settings import check_ranges

    ctx.cfg.finetune[key] = 5  # a percentage where a share is meant: nothing would ever warn
    with pytest.raises(ValueError, match=rf"finetune\.{key}=5: expected"):
        check_ranges(ctx.cfg, Config)


def test_token_coverage_reads_the_ids_of_every_task_layout(ctx):
    """A sentence (pair), a tagged sentence and a SQuAD window, as load_task_data encodes them (SQuAD's as (index,
    features)): each one known piece and one [UNK], between [CLS] and [SEP], which are left out."""
    models = finetuning.MODEL_KINDS["bert"].load(ctx)
    example = {"input_ids": np.asarray(models.tokenizer.encode("great βασιλιάς").ids)}
    assert len(example["input_ids"]) == 4
    data = task_data.TaskData([example, dict(example)], [(0, dict(example))], None, None, None, None)
    assert models.token_coverage(data) == TokenCoverage("[UNK]", 0.5, "piece vectors", 1.0)


def test_train_sizes_of_one_example_and_one_of_each_label_fit_the_baselines_too(ctx):
    """finetune.train_sizes=[1,2]: the models trained on them, then bow_logreg failed the stage with scikit-learn's
    "needs samples of at least 2 classes" (one example) and "n_splits=2 cannot be greater than the number of members
    in each class" (one of each label)."""
    ctx.cfg.finetune.task, ctx.cfg.finetune.seeds, ctx.cfg.finetune.train_sizes = "sst2", [1], [1, 2]
    finetuning.finetune(ctx)
    results = json.loads((ctx.out_dir / "results.json").read_text())
    cells = {(r["model"], r["train_examples"]): r["score"] for r in results}
    assert set(cells) == {("bert", 1), ("bert", 2), ("bow_logreg", 1), ("bow_logreg", 2), ("majority_class", 32)}
    dev = [label for _, label in (line.rsplit("\t", 1) for line in
                                  (Path(ctx.cfg.finetune.data_dir) / "SST-2" / "dev.tsv").read_text().split("\n")[1:]
                                  if line)]
    # one example: its label for every dev sentence
    assert cells["bow_logreg", 1] in {dev.count("0") / len(dev), dev.count("1") / len(dev)}


def test_the_losses_of_a_tiny_fine_tuning_run_stay_what_they_were(ctx, monkeypatch, tmp_path):
    """What fine-tuning computes is pinned, so that a change meant for speed (the loop, the loader, batching, kernels,
    threads) that changes the arithmetic fails here instead of moving the results table unseen: the training losses of
    `bert` (frozen embeddings, layer-wise rates) and then of its random twin, step by step, and their dev accuracy,
    in fp32 on one thread, from an encoder and a tokenizer drawn from fixed seeds. To 4 decimals: kernels of other
    instruction sets round differently in the last bits."""
    torch.manual_seed(0)
    save_pretrained(BertModel(bert_config("bert_tiny", vocab_size=128, max_position_embeddings=64)),
                    tmp_path / "pinned_encoder" / "encoder")
    ctx.inputs["bert_pretrain"] = tmp_path / "pinned_encoder"
    ctx.cfg.finetune.update(task=["sst2"], models=["bert", "bert_random"], seeds=[1], epochs=2, baselines=[])
    losses = []
    training_step = FinetuneModule.training_step

    def recorded(module, batch, batch_idx):
        loss = training_step(module, batch, batch_idx)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(FinetuneModule, "training_step", recorded)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = finetuning.finetune(ctx)["results"]
    finally:
        torch.set_num_threads(threads)
    assert losses == pytest.approx([0.6630, 0.6068, 0.6973, 0.5113, 0.6253, 0.6515, 0.5608, 0.5809,  # bert
                                    0.6853, 0.6043, 0.8964, 0.4100, 0.7111, 0.6569, 0.5416, 0.5379],  # bert_random
                                   abs=1e-4)
    assert {r["model"]: r["score"] for r in rows} == {"bert": 0.5625, "bert_random": 0.5625}


def _rows_but_seconds(out_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"}
            for row in json.loads((out_dir / "results.json").read_text())]


def _must_not_train_here(*args, **kwargs):
    raise AssertionError("with finetune.parallel_runs=2 a run trained in the stage's own process")


@pytest.mark.slow  # Ray workers start, each importing torch and Lightning: 25-40 s
def test_runs_trained_side_by_side_score_as_one_after_another_on_one_thread(ctx, ray_session, monkeypatch, capsys):
    """finetune.parallel_runs=2: two Ray workers of one thread each train the runs, and results.json is, row by row,
    what the runs trained one after another in the stage's process on one thread give. Two tasks: the workers, which
    encode each task themselves, move on to the second."""
    ctx.cfg.finetune.update(task=["sst2", "stsb"], baselines=["majority_class"])
    sequential = replace(ctx, out_dir=ctx.out_dir.parent / "finetune_one_after_another")
    sequential.out_dir.mkdir()
    ctx.cfg.finetune.parallel_runs = 2
    with monkeypatch.context() as patch:
        patch.setattr(finetuning, "finetune_once", _must_not_train_here)
        finetuning.finetune(ctx)
    out = capsys.readouterr().out
    for tag in ("sst2/bert/all/seed1", "sst2/bert/all/seed2", "stsb/bert/all/seed1", "stsb/bert/all/seed2"):
        assert f"finetune {tag}: " in out, tag  # printed by the stage, as each run returns
    sequential.cfg = OmegaConf.merge(ctx.cfg, {"finetune": {"parallel_runs": 1}})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        finetuning.finetune(sequential)
    finally:
        torch.set_num_threads(threads)
    assert _rows_but_seconds(ctx.out_dir) == _rows_but_seconds(sequential.out_dir)
    assert len(_rows_but_seconds(ctx.out_dir)) == 4  # sst2's accuracy and majority, stsb's pearson and spearman


@pytest.mark.slow  # Ray workers start, each importing torch and Lightning: 25-40 s
def test_an_interrupted_stage_trains_only_its_unfinished_runs_on_its_workers(ctx, ray_session, capsys):
    ctx.cfg.finetune.update(task="sst2", seeds=[1, 2, 3], baselines=[], parallel_runs=2)
    finetuning.finetune(ctx)
    first = json.loads((ctx.out_dir / "results.json").read_text())
    kept = finetuning.finished_file(ctx, "sst2/bert/all/seed2")
    kept_bytes, kept_mtime = kept.read_bytes(), kept.stat().st_mtime_ns
    for seed in (1, 3):  # killed before these had finished
        finetuning.finished_file(ctx, f"sst2/bert/all/seed{seed}").unlink()
    (ctx.out_dir / "results.json").unlink()
    capsys.readouterr()
    finetuning.finetune(ctx)
    out = capsys.readouterr().out
    assert "finetune sst2/bert/all/seed2: found sst2-bert-all-seed2.json, skipping" in out
    assert "finetune sst2/bert/all/seed1: accuracy" in out and "finetune sst2/bert/all/seed3: accuracy" in out
    assert "finetune sst2/bert/all/seed2: accuracy" not in out
    assert (kept.read_bytes(), kept.stat().st_mtime_ns) == (kept_bytes, kept_mtime)
    again = json.loads((ctx.out_dir / "results.json").read_text())
    assert [{**row, "seconds": None} for row in again] == [{**row, "seconds": None} for row in first]


def test_a_run_that_fails_on_a_worker_fails_the_stage_naming_the_run(ctx, ray_session):
    ctx.cfg.finetune.update(task="sst2", seeds=[1], baselines=[], parallel_runs=2)
    ctx.cfg.trainer.limit_train_batches = -1  # refused by the Trainer each run builds, on the worker
    with pytest.raises(RuntimeError, match=r"finetune sst2/bert/all/seed1 failed in its Ray worker: \w+: .*"
                                           r"limit_train_batches"):
        finetuning.finetune(ctx)
    assert not finetuning.finished_file(ctx, "sst2/bert/all/seed1").exists()


def test_parallel_runs_default_to_one_per_cpu_of_the_stage_and_one_on_a_gpu(ctx):
    f = finetuning.finetune_settings(ctx.cfg)
    assert f.parallel_runs is None
    assert finetuning.runs_at_once(OmegaConf.merge(ctx.cfg, {"ray": {"num_cpus": 3}}), f) == 3
    assert finetuning.runs_at_once(OmegaConf.merge(ctx.cfg, {"trainer": {"accelerator": "gpu"}}), f) == 1
    assert finetuning.runs_at_once(ctx.cfg, replace(f, parallel_runs=1)) == 1


def test_by_default_only_a_stage_run_as_a_ray_task_trains_on_workers(ctx, ray_session):
    """The default spreads the runs where the pipeline runs the stage, in a Ray task; the stage function called in a
    driver that started Ray (a test module's session, a notebook) trains in its own process, where its patches reach,
    unless finetune.parallel_runs asks for workers. Before, a test's patched finetune_once went unused whenever an
    earlier test of the session had started Ray."""
    import ray

    f = finetuning.finetune_settings(ctx.cfg)
    with finetuning.stage_workers(ctx, f) as workers:
        assert workers is None
    with finetuning.stage_workers(ctx, replace(f, parallel_runs=2)) as workers:
        assert workers is not None

    @ray.remote(num_cpus=0)
    def in_a_task() -> bool:
        with finetuning.stage_workers(ctx, f) as workers:
            return workers is not None

    assert ray.get(in_a_task.remote())
