"""pretrain.init_embeddings=word2vec: BERT's word embeddings start from skip-gram vectors of the corpus's WordPiece
pieces (the piece_vectors stage), and pretrain.freeze_embeddings keeps them as they start; fine-tuning sets `bert`
beside its control, bert_w2v, that start without the pretraining steps."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conventions.piece_vectors import pieces_with_vectors
from data_prep.corpus.tokenizer import load_tokenizer
from models.bert import load_pretrained
from pipeline.bert.pretrain import PRETRAINING
from pipeline.engine.dag import StageContext
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.piece_vectors import PIECE_VECTORS_FILE, read_piece_vectors
from pipeline.report.report import write_report
from tests.helpers import FinetuneStarts, TinyRun, check_control_start, pieces_known, tiny_config

WORD2VEC = ["pretrain.init_embeddings=word2vec", "word2vec.epochs=50"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    root = tmp_path_factory.mktemp("piece_vectors")
    tiny = TinyRun(tiny_config(root, [*WORD2VEC, "pretrain.freeze_embeddings=all"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_piece_vectors"):
        tiny.run_stage(stage)
    return tiny


def test_every_piece_the_corpus_shows_gets_a_vector_of_the_models_width_in_id_order(run):
    vectors = np.load(run.stage_dir("bert_piece_vectors") / PIECE_VECTORS_FILE)
    tok = load_tokenizer(run.stage_dir("bert_tokenizer"))
    assert vectors.shape == (tok.get_vocab_size(), 128)  # bert_tiny's hidden size
    known = ~np.isnan(vectors).any(axis=1)
    assert not known[tok.token_to_id("[MASK]")] and not known[tok.token_to_id("[PAD]")]  # never in the text
    captain, king, morning = (vectors[tok.token_to_id(w)] for w in ("captain", "king", "morning"))
    assert known[tok.token_to_id("captain")] and not np.allclose(captain, king)

    def cosine(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    # the books put the subjects in the same place of their sentences, the endings in another
    assert cosine(captain, king) > cosine(captain, morning)


def test_frozen_word2vec_embeddings_are_the_encoders_after_pretraining(run):
    summary = run.run_stage("bert_pretrain")
    assert summary["steps"] == 30
    vectors = np.load(run.stage_dir("bert_piece_vectors") / PIECE_VECTORS_FILE)
    known = ~np.isnan(vectors).any(axis=1)
    words = load_pretrained(run.stage_dir("bert_pretrain") / "encoder").embeddings.word_embeddings.weight.detach()
    expected = vectors[known] / vectors[known].std() / 128 ** 0.5  # rows of unit length on average
    assert np.linalg.norm(expected, axis=1).mean() == pytest.approx(1.0, abs=0.05)
    difference = (words[:len(known)][torch.from_numpy(known)] - torch.from_numpy(expected)).abs()
    assert difference.max() < 1e-4  # numpy's and torch's float32 standard deviations differ in the last digits


def test_with_vector_keeps_the_rows_that_have_a_piece_vector_bit_for_bit_and_trains_the_others(run, tmp_path):
    """pretrain.freeze_embeddings=with_vector: after pretraining, the word-embedding rows that started from a piece
    vector are their start bit for bit (AdamW's weight decay included); the others, the pieces the corpus never shows
    and the padding rows, left their random initialisation (the tied masked-LM decoder trains them)."""
    root = Path(run.cfg.paths.cache_dir).parent  # the module's corpus and cache: the stages before pretraining cached
    tiny = TinyRun(tiny_config(root, [*WORD2VEC, "pretrain.freeze_embeddings=with_vector"]))
    summary = tiny.run_stage("bert_pretrain")
    assert summary["steps"] == 30
    phase = PRETRAINING["bert_pretrain"]
    ctx = StageContext(tiny.cfg, "bert_pretrain", tmp_path, {name: tiny.stage_dir(name) for name in (
        "bert_tokenizer", "bert_piece_vectors")})
    start = phase.build_module(ctx, phase.settings(tiny.cfg)).model.bert.embeddings.word_embeddings.weight.detach()
    after = load_pretrained(tiny.stage_dir("bert_pretrain") / "encoder").embeddings.word_embeddings.weight.detach()
    known = np.zeros(len(start), dtype=bool)
    has_vector = pieces_with_vectors(read_piece_vectors(tiny.stage_dir("bert_piece_vectors")))
    known[:len(has_vector)] = has_vector
    known = torch.from_numpy(known)
    assert 0 < int(known.sum()) < len(start)
    assert torch.equal(after[known], start[known])
    moved = (after[~known] - start[~known]).abs().amax(dim=1)
    assert (moved > 0).all()


def test_unfrozen_word2vec_embeddings_start_there_and_move(tmp_path, ray_session):
    tiny = TinyRun(tiny_config(tmp_path, [*WORD2VEC, "pretrain.freeze_embeddings=none"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_piece_vectors", "bert_pretrain"):
        tiny.run_stage(stage)
    vectors = np.load(tiny.stage_dir("bert_piece_vectors") / PIECE_VECTORS_FILE)
    model = load_pretrained(tiny.stage_dir("bert_pretrain") / "encoder")
    start = model.embeddings.word_embeddings.weight.detach().clone()
    start_word_embeddings(model.embeddings.word_embeddings, vectors)
    known = torch.from_numpy(~np.isnan(vectors).any(axis=1))
    moved = (model.embeddings.word_embeddings.weight.detach()[:len(known)] - start[:len(known)])[known].abs()
    assert moved.max() > 1e-3  # pretraining moved them from where word2vec put them


def test_the_control_starts_where_pretraining_did_with_the_layers_and_head_of_bert_random(run, tmp_path):
    """bert_w2v: the pretrained encoder's architecture and tokenizer, its word embeddings the piece vectors exactly as
    pretraining set them (frozen there, so they are the pretrained encoder's too), every other weight a fresh
    initialisation of the fine-tuning seed: bert_random's at that seed, the head bert's."""
    run.run_stage("bert_pretrain")  # read back where a test before ran it
    starts = FinetuneStarts(run, tmp_path, ("bert_tokenizer", "bert_pretrain", "bert_piece_vectors"), "bert")
    sources = starts.sources
    assert list(sources) == ["bert", "bert_random", "bert_w2v"]
    encoder = load_pretrained(run.stage_dir("bert_pretrain") / "encoder")
    assert sources["bert_w2v"].piece_vector_start.config == encoder.config
    assert sources["bert_w2v"].encoding_key == sources["bert"].encoding_key  # the same tokenizer: encoded once
    control, twin, pretrained = starts.state("bert_w2v"), starts.state("bert_random"), starts.state("bert")
    layer = "bert.encoder.layer.0.attention.self.query.weight"
    head = [name for name in control if not name.startswith("bert.")]
    check_control_start(control, twin, pretrained, "bert.embeddings.word_embeddings.weight",
                        pieces_known(run.stage_dir("bert_piece_vectors")), layer, head)
    assert not torch.equal(starts.state("bert_w2v", seed=2)[layer], control[layer])  # each seed draws its own layers


def test_fine_tuning_and_the_report_set_bert_beside_its_random_twin_and_its_control(run, tmp_path):
    for stage in ("bert_pretrain", "word2vec"):
        run.run_stage(stage)
    rows = run.run_stage("finetune")["results"]
    assert [r["model"] for r in rows][:3] == ["bert", "bert_random", "bert_w2v"]
    stored = json.loads((run.stage_dir("finetune") / "results.json").read_text())
    assert {r["model"]: r.get("control") for r in stored}["bert"] == "bert_w2v"  # what the report pairs
    assert not any("control" in r for r in stored if r["model"] != "bert")
    # bert and its control start from the same piece vectors, so they cover the task's tokens alike; the twin from none
    coverage = {r["model"]: r["token_coverage"] for r in stored if r["model"].startswith("bert")}
    assert coverage["bert"] == coverage["bert_w2v"] and coverage["bert"]["vectors"] == "piece vectors"
    assert 0 < coverage["bert"]["vector_coverage"] <= 1 and "vectors" not in coverage["bert_random"]
    out = tmp_path / "report"
    out.mkdir()
    md = write_report({"finetune": run.stage_dir("finetune")}, out, "unit")["results_md"].read_text()
    assert re.search(r"\| bert_w2v \(\[UNK\] \d+\.\d% of the task's tokens; piece vectors cover \d+%[^|]*\) \| sst2 "
                     r"\| accuracy \|", md)
    assert "- sst2 accuracy: bert - bert_random = " in md
    assert "- sst2 accuracy: bert - bert_w2v = " in md and "(bert_w2v is the control, the same start without " \
        "what pretraining trained: the difference is what pretraining itself bought)" in md
