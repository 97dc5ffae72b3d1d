"""pretrain.init_embeddings=word2vec: BERT's word embeddings start from skip-gram vectors of the corpus's WordPiece
pieces (the piece_vectors stage), and pretrain.freeze_embeddings keeps them as they start."""
import numpy as np
import pytest
import torch

from data_prep.corpus.tokenizer import load_tokenizer
from models.bert import load_pretrained
from pipeline.bert.data_stages import PIECE_VECTORS_FILE
from pipeline.bert.pretrain import start_word_embeddings
from tests.helpers import TinyRun, tiny_config

WORD2VEC = ["pretrain.init_embeddings=word2vec", "word2vec.epochs=50"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    root = tmp_path_factory.mktemp("piece_vectors")
    tiny = TinyRun(tiny_config(root, [*WORD2VEC, "pretrain.freeze_embeddings=true"]))
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


def test_unfrozen_word2vec_embeddings_start_there_and_move(tmp_path, ray_session):
    tiny = TinyRun(tiny_config(tmp_path, [*WORD2VEC, "pretrain.freeze_embeddings=false"]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_piece_vectors", "bert_pretrain"):
        tiny.run_stage(stage)
    vectors = np.load(tiny.stage_dir("bert_piece_vectors") / PIECE_VECTORS_FILE)
    model = load_pretrained(tiny.stage_dir("bert_pretrain") / "encoder")
    start = model.embeddings.word_embeddings.weight.detach().clone()
    start_word_embeddings(model.embeddings.word_embeddings, vectors)
    known = torch.from_numpy(~np.isnan(vectors).any(axis=1))
    moved = (model.embeddings.word_embeddings.weight.detach()[:len(known)] - start[:len(known)])[known].abs()
    assert moved.max() > 1e-3  # pretraining moved them from where word2vec put them
