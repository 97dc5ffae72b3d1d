"""Quick-Thoughts (skip_thought.objective=quick_thought; Logeswaran & Lee 2018), Skip-Thought's word embeddings started
from the run's word2vec vectors (pretrain.init_embeddings=word2vec), the control kind that is that start without a
pretraining step (skip_thought_w2v), and skip_thought_words, the encoder's vector beside the mean of the word
vectors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from data_prep.corpus.word_vectors import WordVectors
from data_prep.examples.skip_thought_examples import SPECIAL_WORDS, WordVocab
from models.skip_thought import (
    OBJECTIVES,
    QuickThoughts,
    SkipThoughts,
    load_pretrained,
    save_pretrained,
    skip_thought_config,
    skip_thought_model,
)
from pipeline import CONF_DIR
from pipeline.downstream.baselines import mean_word_vectors
from pipeline.downstream.finetune import controls_in_run, finetune_kinds, finetune_settings, finetune_upstream
from pipeline.downstream.word2vec import load_word2vec
from pipeline.engine.dag import StageContext
from pipeline.runner import validate
from pipeline.skip_thought.downstream import FINETUNE_KINDS, SkipThoughtTaskModels
from pipeline.skip_thought.encoder import SkipThoughtSentenceEncoder
from pipeline.skip_thought.module import QuickThoughtPretrainModule, collate_triples, pad_sentences
from pipeline.skip_thought.pretrain import word_vector_table
from pipeline.skip_thought.settings import Objective
from tests.helpers import TinyRun, family_config, optimizer_settings


def tiny_config(**overrides):
    return skip_thought_config("skip_thought_small", **{"vocab_size": 50, "embedding_dim": 8, "encoder_dim": 12,
                                                        "decoder_dim": 10, **overrides})


# --- Quick-Thoughts ----------------------------------------------------------------------------------------------


def test_quick_thought_training_finds_each_sentences_neighbours_among_the_batchs_candidates():
    """Toy triples whose neighbours share the current sentence's words (previous: them reversed, next: all but the
    first), every triple its own words: the loss falls from the uniform 2 log(2B) and every sentence's best candidate
    becomes one of its own two."""
    rng = np.random.default_rng(0)
    words = rng.permutation(np.arange(3, 50))
    triples = [{"current": words[3 * i:3 * i + 3].tolist(), "previous": words[3 * i:3 * i + 3][::-1].tolist(),
                "next": words[3 * i + 1:3 * i + 3].tolist()} for i in range(12)]
    batch = collate_triples(triples)
    torch.manual_seed(0)
    module = QuickThoughtPretrainModule(QuickThoughts(tiny_config(objective="quick_thought")),
                                        optimizer_settings(1e-2, 0, 150))
    with torch.no_grad():
        initial = module.model_step(batch)
    assert initial["loss"].item() == pytest.approx(2 * np.log(24), rel=0.05)  # near-uniform at U(-0.1, 0.1)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        module.model_step(batch)["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        trained = module.model_step(batch)
    assert trained["loss"].item() < 0.5 * initial["loss"].item()
    assert trained["context_acc"].item() == 1.0


def test_quick_thought_scores_are_f_of_each_sentence_against_g_of_each_candidate():
    torch.manual_seed(0)
    model = QuickThoughts(tiny_config(objective="quick_thought")).eval()
    triples = [{"previous": [5, 6], "current": [7, 8, 9], "next": [10]},
               {"previous": [11], "current": [12], "next": [13, 14, 15, 16]}]
    batch = collate_triples(triples)
    with torch.no_grad():
        scores = model(**batch)
        vectors = {name: model.encode(*pad_sentences([t[name] for t in triples]))
                   for name in ("current", "previous", "next")}
    half = model.config.encoder_dim
    f = vectors["current"][:, :half]
    g = torch.cat([vectors["previous"][:, half:], vectors["next"][:, half:]])  # previous_1, previous_2, next_1, next_2
    torch.testing.assert_close(scores, f @ g.t())
    assert vectors["current"].shape == (2, 2 * half)  # the sentence vector [f(s); g(s)]


def test_the_objective_picks_the_model_class_and_survives_a_checkpoint(tmp_path):
    assert set(OBJECTIVES) == set(Objective)  # the pipeline's setting names the models' objectives
    torch.manual_seed(0)
    model = skip_thought_model(tiny_config(objective="quick_thought")).eval()
    assert isinstance(model, QuickThoughts) and isinstance(skip_thought_model(tiny_config()), SkipThoughts)
    save_pretrained(model, tmp_path / "model")
    loaded = load_pretrained(tmp_path / "model").eval()
    ids, lengths = pad_sentences([[5, 6, 7]])
    assert isinstance(loaded, QuickThoughts)
    torch.testing.assert_close(loaded.encode(ids, lengths), model.encode(ids, lengths))
    with pytest.raises(ValueError, match="objective must be one of"):
        tiny_config(objective="quick_thoughts")


def test_an_unknown_objective_fails_at_composition():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert compose(config_name="config", overrides=["+experiment=skip_thought_small",
                                                        "skip_thought.objective=quick_thought"])
        with pytest.raises(ConfigCompositionException, match="skip_thought.objective"):
            compose(config_name="config", overrides=["+experiment=skip_thought_small",
                                                     "skip_thought.objective=quick_thoughts"])


# --- the word2vec start and the words beside the vector ------------------------------------------------------------


def test_each_vocabulary_word_gets_its_own_word2vec_vector_and_the_others_none():
    vocab = WordVocab((*SPECIAL_WORDS, "good", "film", "zyzzyva"))
    vectors = WordVectors(("film", "bad", "good"), np.arange(6, dtype=np.float32).reshape(3, 2))
    table = word_vector_table(vocab, vectors)
    assert table.shape == (len(vocab), 2)
    np.testing.assert_array_equal(table[vocab.index["good"]], [4, 5])
    np.testing.assert_array_equal(table[vocab.index["film"]], [0, 1])
    # the special words and a word word2vec never kept keep their initialisation (start_word_embeddings)
    assert np.isnan(table[[*range(len(SPECIAL_WORDS)), vocab.index["zyzzyva"]]]).all()


def test_skip_thought_words_reads_the_encoders_vector_then_the_mean_of_the_word_vectors():
    vocab = WordVocab((*SPECIAL_WORDS, "a", "good", "film"))
    vectors = WordVectors(("good", "film", "bad"), np.arange(9, dtype=np.float32).reshape(3, 3))
    torch.manual_seed(0)
    encoder = SkipThoughtSentenceEncoder([SkipThoughts(tiny_config(vocab_size=len(vocab)))], vocab, "skip_thought")
    texts = ["a good film", "bad film !", "unheard of"]
    alone = SkipThoughtTaskModels(encoder, "skip_thought").vectors(texts)
    combined = SkipThoughtTaskModels(encoder, "skip_thought_words", vectors).vectors(texts)
    np.testing.assert_array_equal(combined, np.concatenate([alone, mean_word_vectors(texts, vectors)], axis=1))
    np.testing.assert_array_equal(combined[:, -3:], [[1.5, 2.5, 3.5], [4.5, 5.5, 6.5], [0, 0, 0]])


# --- through the stages ------------------------------------------------------------------------------------------

WIDTH = 16  # the tiny Skip-Thought's embedding_dim (Family.tiny)
WORD2VEC_START = ["pretrain.init_embeddings=word2vec", "pretrain.freeze_embeddings=all",
                  f"word2vec.vector_size={WIDTH}", "word2vec.min_count=1", "skip_thought.objective=quick_thought",
                  "finetune.models=[skip_thought]", "pretrain.max_steps=12", "pretrain.val_every_steps=6"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    tiny = TinyRun(family_config(tmp_path_factory.mktemp("quick_thought_w2v"), "skip_thought", WORD2VEC_START))
    for stage in ("prepare", "skip_thought_vocab", "skip_thought_examples", "word2vec", "skip_thought_pretrain"):
        tiny.run_stage(stage)
    return tiny


@pytest.mark.slow  # a tiny run's stages, word2vec and 12 Quick-Thoughts steps: ~25 s on 2 cores
def test_the_control_is_the_start_of_pretraining_word2vec_rows_under_the_twins_layers(run, tmp_path):
    """skip_thought_w2v: the word embeddings the word2vec vectors of the vocabulary's words, as pretraining set them
    (frozen there, so the pretrained model's too), the recurrent layers the random twin's draw, no step taken."""
    cfg = run.cfg
    assert list(finetune_kinds(cfg, finetune_settings(cfg))) == ["skip_thought", "skip_thought_random",
                                                                 "skip_thought_w2v"]
    assert controls_in_run(cfg, finetune_kinds(cfg, finetune_settings(cfg))) == {"skip_thought": "skip_thought_w2v"}
    ctx = StageContext(cfg, "finetune", tmp_path, {name: run.stage_dir(name) for name in (
        "skip_thought_vocab", "skip_thought_pretrain", "word2vec")})
    control, twin, pretrained = (FINETUNE_KINDS[kind].load(ctx).encoder.model.state_dict()
                                 for kind in ("skip_thought_w2v", "skip_thought_random", "skip_thought"))
    assert isinstance(FINETUNE_KINDS["skip_thought"].load(ctx).encoder.model, QuickThoughts)
    vocab = WordVocab.load(run.stage_dir("skip_thought_vocab") / "vocab.txt")
    table = word_vector_table(vocab, load_word2vec(run.stage_dir("word2vec")))
    known = torch.from_numpy(~np.isnan(table).any(axis=1))
    assert known.sum() > len(vocab) // 2
    rows = control["embedding.weight"]
    # each known word's row is its word2vec vector, all rescaled by one factor (start_word_embeddings)
    scale = rows[known] / torch.from_numpy(table)[known]
    torch.testing.assert_close(scale, torch.full_like(scale, scale[0, 0].item()))
    assert torch.equal(rows, pretrained["embedding.weight"])  # frozen through pretraining
    assert torch.equal(rows[~known], twin["embedding.weight"][~known])
    layers = [name for name in control if name != "embedding.weight"]
    assert layers and all(torch.equal(control[name], twin[name]) for name in layers)
    assert not torch.equal(control["encoder.gru.weight_hh"], pretrained["encoder.gru.weight_hh"])


@pytest.mark.slow
def test_the_control_reads_no_pretraining_and_is_refused_without_the_word2vec_start(run):
    cfg = run.cfg.copy()
    cfg.finetune.models = ["skip_thought_w2v"]
    assert finetune_upstream(cfg) == ("skip_thought_vocab", "word2vec")
    cfg.finetune.models = ["skip_thought", "skip_thought_w2v"]
    cfg.pipeline.stages = ["finetune"]
    validate(cfg)
    cfg.pretrain.init_embeddings = "random"
    with pytest.raises(ValueError, match="finetune.models has skip_thought_w2v, .* in this run skip_thought_random "
                                         "is skip_thought's control"):
        validate(cfg)


@pytest.mark.slow
def test_start_up_refuses_a_width_other_than_word2vecs_and_an_objective_in_the_model_config(run):
    cfg = run.cfg.copy()
    cfg.word2vec.vector_size = 24
    with pytest.raises(ValueError, match=r"16-value word embeddings from word2vec's 24-value vectors; set "
                                         r"\+\+model.config.embedding_dim=24"):
        validate(cfg)
    cfg = run.cfg.copy()
    cfg.model.config.objective = "quick_thought"
    with pytest.raises(ValueError, match="model.config.objective=quick_thought: the pretraining stages set it"):
        validate(cfg)
