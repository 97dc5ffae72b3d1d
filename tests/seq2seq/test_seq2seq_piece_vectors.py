"""pretrain.init_embeddings=word2vec for the encoder-decoder: its shared embeddings (the encoder's and the decoder's
input, and the output layer) start from skip-gram vectors of the corpus's byte-level pieces (seq2seq_piece_vectors,
the stage function BERT's and GPT's run too), pretrain.freeze_embeddings keeps them as they start, and fine-tuning
sets `seq2seq` beside its control seq2seq_w2v, that start without the pretraining steps, instead of the random twin."""
import lightning as L
import numpy as np
import pyarrow as pa
import pytest
import torch

from data_prep.corpus.shards import shard_paths
from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from pipeline.downstream.finetune import (
    MODEL_KINDS,
    finetune_kinds,
    finetune_settings,
    finetune_upstream,
)
from pipeline.engine.arrow import read_arrow
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.piece_vectors import read_piece_vectors
from pipeline.runner import validate
from pipeline.seq2seq.architectures import load_model
from pipeline.seq2seq.data_stages import spaced_ids
from tests.helpers import FinetuneStarts, TinyRun, check_control_start, pieces_known, seq2seq_transformer_config
from tests.seq2seq.test_seq2seq_finetune import write_headline_task

WORD2VEC = ["pretrain.init_embeddings=word2vec", "word2vec.epochs=20"]
LAYER = "encoder.layers.0.fc1.weight"


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    root = tmp_path_factory.mktemp("seq2seq_piece_vectors")
    task_dir = write_headline_task(root / "bbc")
    tiny = TinyRun(seq2seq_transformer_config(root, [
        *WORD2VEC, "pretrain.freeze_embeddings=all", "pretrain.max_steps=10", f"finetune.data_dir={task_dir}",
        "finetune.task=bbc_headlines", "finetune.max_seq_length=32", "finetune.models=[seq2seq]"]))
    for stage in ("prepare", "seq2seq_tokenizer", "seq2seq_examples", "seq2seq_piece_vectors", "seq2seq_pretrain"):
        tiny.run_stage(stage)
    return tiny


def test_every_piece_of_the_corpus_read_after_a_space_gets_a_vector_of_the_models_width(run):
    vectors = read_piece_vectors(run.stage_dir("seq2seq_piece_vectors"))
    tok = load_seq2seq_tokenizer(run.stage_dir("seq2seq_tokenizer"))
    width = load_model(run.stage_dir("seq2seq_pretrain") / "model").shared.embedding_dim
    assert vectors.shape == (tok.get_vocab_size(), width)
    sentences = [text for shard in shard_paths(run.stage_dir("prepare"))
                 for text in read_arrow(shard).column("text").to_pylist()]
    # the pieces as fine-tuning reads a task's text and pretraining every sentence of a book but its first: after
    # a space (encode_texts), so a word's first piece is the one it has inside a text
    shown = {i for encoding in tok.encode_batch([" " + s for s in sentences]) for i in encoding.ids}
    assert set(np.flatnonzero(~np.isnan(vectors).any(axis=1)).tolist()) == shown
    assert spaced_ids(tok, pa.array(sentences[:1])) == [tok.encode(" " + sentences[0]).ids] \
        != [tok.encode(sentences[0]).ids]


def test_pretraining_reads_the_vectors_only_where_it_starts_from_them(run):
    cfg = run.cfg.copy()
    cfg.pipeline.stages = ["seq2seq_pretrain"]
    assert TinyRun(cfg).plan.order == ["prepare", "seq2seq_tokenizer", "seq2seq_examples", "seq2seq_piece_vectors",
                                       "seq2seq_pretrain"]
    cfg.pretrain.init_embeddings = "random"
    assert TinyRun(cfg).plan.order == ["prepare", "seq2seq_tokenizer", "seq2seq_examples", "seq2seq_pretrain"]


def test_the_control_is_seq2seq_w2v_with_the_vectors_and_the_random_twin_without_them(run):
    cfg = run.cfg.copy()
    kinds = MODEL_KINDS
    assert kinds["seq2seq"].control(cfg) == "seq2seq_w2v"
    assert list(finetune_kinds(cfg, finetune_settings(cfg))) == ["seq2seq", "seq2seq_random", "seq2seq_w2v"]
    cfg.finetune.models = ["seq2seq_w2v"]
    assert finetune_upstream(cfg) == ("seq2seq_pretrain", "seq2seq_piece_vectors")
    cfg.finetune.models = ["seq2seq", "seq2seq_w2v"]
    validate(cfg)
    cfg.pretrain.init_embeddings = "random"
    assert kinds["seq2seq"].control(cfg) == "seq2seq_random"
    with pytest.raises(ValueError, match="finetune.models has seq2seq_w2v, .* in this run seq2seq_random is "
                                         "seq2seq's control; remove seq2seq_w2v from finetune.models"):
        validate(cfg)


def test_frozen_piece_vectors_are_the_shared_embeddings_after_pretraining(run):
    vectors = read_piece_vectors(run.stage_dir("seq2seq_piece_vectors"))
    known = torch.from_numpy(~np.isnan(vectors).any(axis=1))
    model = load_model(run.stage_dir("seq2seq_pretrain") / "model")
    L.seed_everything(run.cfg.seed, workers=True, verbose=False)  # as seq2seq_pretrain built its model
    start = type(model)(model.config)
    layer = start.state_dict()[LAYER].clone()
    assert start_word_embeddings(start.shared, vectors) == int(known.sum())
    rows = start.shared.weight.detach()
    assert rows[known].norm(dim=1).mean() == pytest.approx(1.0, abs=0.05)  # unit length on average
    # through every step, the encoder's and decoder's inputs and the tied output layer being this one table
    assert torch.equal(model.shared.weight.detach(), rows)
    assert (model.state_dict()[LAYER] - layer).abs().max() > 1e-4  # the layers trained around them


def test_the_control_starts_where_pretraining_did_with_every_other_weight_the_random_twins(run, tmp_path):
    starts = FinetuneStarts(run, tmp_path, ("seq2seq_tokenizer", "seq2seq_pretrain", "seq2seq_piece_vectors"),
                            "seq2seq")
    control, twin, pretrained = starts.state("seq2seq_w2v"), starts.state("seq2seq_random"), starts.state("seq2seq")
    check_control_start(control, twin, pretrained, "shared.weight",
                        pieces_known(run.stage_dir("seq2seq_piece_vectors")), LAYER, head=None)
    assert not torch.equal(starts.state("seq2seq_w2v", seed=2)[LAYER], control[LAYER])  # each seed draws its own layers


def test_finetune_seq2seq_dropout_reaches_the_model_its_twin_and_its_control_and_null_keeps_the_pretrained(run,
                                                                                                           tmp_path):
    upstream = ("seq2seq_tokenizer", "seq2seq_pretrain", "seq2seq_piece_vectors")
    pretrained = load_model(run.stage_dir("seq2seq_pretrain") / "model").config.dropout
    for setting, expected in ((None, pretrained), (0.5, 0.5)):
        cfg = run.cfg.copy()
        cfg.finetune.seq2seq_dropout = setting
        starts = FinetuneStarts(TinyRun(cfg), tmp_path / str(setting), upstream, "seq2seq")
        for kind in ("seq2seq", "seq2seq_random", "seq2seq_w2v"):
            model = starts.sources[kind].build(starts.data)
            rates = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
            assert model.config.dropout == expected and expected in rates, (kind, setting)
    assert pretrained != 0.5
