"""pretrain.init_embeddings=word2vec for GPT: its token embeddings start from skip-gram vectors of the corpus's
byte-level pieces (gpt_piece_vectors, the stage function bert_piece_vectors runs too), pretrain.freeze_embeddings
keeps them (and the output layer tied to them) as they start, and fine-tuning sets `gpt` beside its control, gpt_w2v,
that start without the pretraining steps."""
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from conventions.piece_vectors import pieces_with_vectors
from data_prep.corpus.shards import shard_paths
from data_prep.examples.gpt_blocks import end_of_text_id, load_gpt_tokenizer
from models.gpt import load_pretrained
from pipeline.downstream.finetune import (
    finetune_kinds,
    finetune_settings,
    finetune_upstream,
    model_sources,
    scored_tasks,
)
from pipeline.downstream.tasks import resolve_task_dir
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import StageContext
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.engine.settings import cache_dir_of
from pipeline.piece_vectors import read_piece_vectors
from pipeline.runner import validate
from tests.helpers import FinetuneStarts, TinyRun, check_control_start, family_config, pieces_known

WORD2VEC = ["pretrain.init_embeddings=word2vec", "word2vec.epochs=20"]
WIDTH = 32  # the tiny GPT's n_embd (tests/helpers.py TINY_FAMILIES)


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    tiny = TinyRun(family_config(tmp_path_factory.mktemp("gpt_piece_vectors"), "gpt",
                                 [*WORD2VEC, "pretrain.freeze_embeddings=all", "finetune.models=[gpt]"]))
    for stage in ("prepare", "gpt_tokenizer", "gpt_blocks", "gpt_piece_vectors", "gpt_pretrain"):
        tiny.run_stage(stage)
    return tiny


def test_every_piece_the_corpus_shows_gets_a_vector_of_the_models_width_in_id_order(run):
    vectors = read_piece_vectors(run.stage_dir("gpt_piece_vectors"))
    tok = load_gpt_tokenizer(run.stage_dir("gpt_tokenizer"))
    assert vectors.shape == (tok.get_vocab_size(), WIDTH)
    sentences = [text for shard in shard_paths(run.stage_dir("prepare"))
                 for text in read_arrow(shard).column("text").to_pylist()]
    shown = {i for encoding in tok.encode_batch(sentences) for i in encoding.ids}
    # the rows with a vector are the ids of the sentences as fine-tuning encodes a task's text, no other
    assert set(np.flatnonzero(~np.isnan(vectors).any(axis=1)).tolist()) == shown
    assert end_of_text_id(tok) not in shown  # between books in the blocks, never inside a sentence
    # (where each id's row goes is the shared stage's, whose geometry tests/bert/test_piece_vectors.py checks: the
    # tiny BPE's 300 pieces are mostly single letters, which no context places)


def test_the_control_reads_no_pretraining_stage_and_the_pretraining_reads_the_vectors(run):
    cfg = run.cfg.copy()
    cfg.finetune.models = ["gpt_w2v"]
    cfg.finetune.baselines = ["majority_class"]  # w2v_mean reads the word2vec stage
    cfg.pipeline.stages = ["finetune"]
    assert finetune_upstream(cfg) == ("gpt_tokenizer", "gpt_piece_vectors")
    assert TinyRun(cfg).plan.order == ["prepare", "gpt_tokenizer", "gpt_piece_vectors", "finetune"]
    cfg.pipeline.stages = ["gpt_pretrain"]
    assert TinyRun(cfg).plan.order == ["prepare", "gpt_tokenizer", "gpt_blocks", "gpt_piece_vectors", "gpt_pretrain"]
    cfg.pretrain.init_embeddings = "random"
    assert TinyRun(cfg).plan.order == ["prepare", "gpt_tokenizer", "gpt_blocks", "gpt_pretrain"]


def test_gpt_w2v_is_refused_where_pretraining_does_not_start_from_the_piece_vectors(run):
    cfg = run.cfg.copy()
    cfg.finetune.models = ["gpt", "gpt_w2v"]
    validate(cfg)  # the tiny config with the piece-vector start composes and passes start-up
    cfg.pretrain.init_embeddings = "random"
    with pytest.raises(ValueError, match="finetune.models has gpt_w2v, .* in this run gpt_random is gpt's control; "
                                         "remove gpt_w2v from finetune.models"):
        validate(cfg)


def test_frozen_piece_vectors_are_the_token_embeddings_and_the_lm_head_after_pretraining(run):
    vectors = read_piece_vectors(run.stage_dir("gpt_piece_vectors"))
    known = torch.from_numpy(~np.isnan(vectors).any(axis=1))
    model = load_pretrained(run.stage_dir("gpt_pretrain") / "model")
    L.seed_everything(run.cfg.seed, workers=True, verbose=False)  # as gpt_pretrain built its model
    start = type(model)(model.config)
    layer = start.transformer.h[0].attn.c_attn.weight.detach().clone()
    assert start_word_embeddings(start.transformer.wte, vectors) == int(known.sum())
    rows = start.transformer.wte.weight.detach()
    assert rows[known].norm(dim=1).mean() == pytest.approx(1.0, abs=0.05)  # unit length on average
    # through every pretraining step, the tied output layer being this same table: the vectors where the corpus has
    # them, the initialisation elsewhere
    assert torch.equal(model.transformer.wte.weight.detach(), rows)
    moved = model.transformer.h[0].attn.c_attn.weight.detach() - layer
    assert moved.abs().max() > 1e-3  # the layers trained around them


def test_with_vector_keeps_the_rows_that_have_a_piece_vector_in_pretraining_and_fine_tuning(run, tmp_path):
    """pretrain.freeze_embeddings=with_vector: after pretraining, the rows with a piece vector are their start bit for
    bit, the others (pieces the corpus never shows, end-of-text) trained through the tied LM head; fine-tuning's `gpt`
    and `gpt_w2v` know those rows (pieces_with_vectors), which finetune.freeze_embeddings=with_vector keeps."""
    root = Path(run.cfg.paths.cache_dir).parent  # the module's corpus
    tiny = TinyRun(family_config(root, "gpt", [*WORD2VEC, "pretrain.freeze_embeddings=with_vector",
                                               "finetune.models=[gpt]"]))
    for stage in ("prepare", "gpt_tokenizer", "gpt_blocks", "gpt_piece_vectors", "gpt_pretrain"):
        tiny.run_stage(stage)
    vectors = read_piece_vectors(tiny.stage_dir("gpt_piece_vectors"))
    known = torch.from_numpy(pieces_with_vectors(vectors))
    model = load_pretrained(tiny.stage_dir("gpt_pretrain") / "model")
    L.seed_everything(tiny.cfg.seed, workers=True, verbose=False)  # as gpt_pretrain built its model
    start = type(model)(model.config)
    start_word_embeddings(start.transformer.wte, vectors)
    before, after = start.transformer.wte.weight.detach(), model.transformer.wte.weight.detach()
    assert 0 < int(known.sum()) < len(known)
    assert torch.equal(after[known], before[known])
    assert ((after[~known] - before[~known]).abs().amax(dim=1) > 0).all()
    f = finetune_settings(tiny.cfg)
    assert "gpt_piece_vectors" in finetune_upstream(tiny.cfg)
    ctx = StageContext(tiny.cfg, "finetune", tmp_path, {name: tiny.stage_dir(name) for name in (
        "gpt_tokenizer", "gpt_pretrain", "gpt_piece_vectors")})
    sources = {kind: models for kind, (models, _) in model_sources(ctx, f).items()}
    assert np.array_equal(sources["gpt"].pieces_with_vectors, known.numpy())
    assert np.array_equal(sources["gpt_w2v"].pieces_with_vectors, known.numpy())
    assert sources["gpt_random"].pieces_with_vectors is None


def test_the_control_starts_where_pretraining_did_with_the_layers_and_head_of_gpt_random(run, tmp_path):
    """gpt_w2v: the pretrained GPT's architecture and tokenizer, its token embeddings the piece vectors exactly as
    pretraining set them (frozen there, so they are the pretrained GPT's too), every other weight a fresh
    initialisation of the fine-tuning seed: gpt_random's at that seed, the head gpt's."""
    assert list(finetune_kinds(run.cfg, finetune_settings(run.cfg))) == ["gpt", "gpt_random", "gpt_w2v"]
    starts = FinetuneStarts(run, tmp_path, ("gpt_tokenizer", "gpt_pretrain", "gpt_piece_vectors"), "gpt")
    assert starts.encode("gpt_w2v").train == starts.data.train  # the same tokenizer and context
    control, twin, pretrained = starts.state("gpt_w2v"), starts.state("gpt_random"), starts.state("gpt")
    layer = "lm.transformer.h.0.attn.c_attn.weight"
    head = [name for name in control if name.startswith("head.")]
    check_control_start(control, twin, pretrained, "lm.transformer.wte.weight",
                        pieces_known(run.stage_dir("gpt_piece_vectors")), layer, head)
    assert not torch.equal(starts.state("gpt_w2v", seed=2)[layer], control[layer])  # each seed draws its own layers


def test_finetune_gpt_pooling_reaches_gpt_its_twin_and_its_control(run, tmp_path):
    """finetune.gpt_pooling builds the same head for the three kinds, so that the control and the twin stay the
    pretrained GPT's comparison whatever the head reads."""
    cfg = run.cfg.copy()
    cfg.finetune.gpt_pooling = "last_embedding_mean"
    f = finetune_settings(cfg)
    ctx = StageContext(cfg, "finetune", tmp_path, {name: run.stage_dir(name) for name in (
        "gpt_tokenizer", "gpt_pretrain", "gpt_piece_vectors")})
    sources = {kind: models for kind, (models, _) in model_sources(ctx, f).items()}
    assert sorted(sources) == ["gpt", "gpt_random", "gpt_w2v"]
    task = scored_tasks(cfg, f)[0]
    data = sources["gpt"].encode(task, resolve_task_dir(task, f.data_dir, cache_dir_of(cfg)), f, cfg.seed, None)
    for kind, models in sources.items():
        model = models.build(data)
        assert (kind, model.pooling, model.head.in_features) == (kind, "last_embedding_mean", 2 * WIDTH)
