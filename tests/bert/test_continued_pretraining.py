"""pretrain.init_from: BERT pretraining continued from a HuggingFace BERT directory (Gururangan et al. 2020's DAPT),
with that checkpoint's architecture, weights and tokenizer."""
import json

import pytest
import torch

from data_prep.corpus.tokenizer import load_tokenizer
from models.hf.bert import continue_from_hf
from pipeline.bert.pretrain import _build_model
from pipeline.runner import validate
from tests.helpers import ENDINGS, OBJECTS, SUBJECTS, VERBS, TinyRun, tiny_config

transformers = pytest.importorskip("transformers")


def write_checkpoint(directory, heads: bool):
    """A small HF BERT with a vocab.txt laid out as Google's ([UNK] at 100, [CLS] 101, [SEP] 102, [MASK] 103)."""
    words = sorted({w.lower() for phrase in SUBJECTS + VERBS + OBJECTS + ENDINGS for w in phrase.split()} |
                   {"book", "."})
    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = (transformers.BertForPreTraining if heads else transformers.BertModel)(config)
    model.save_pretrained(directory)
    return model, vocab


def test_continued_pretraining_reads_with_the_checkpoints_tokenizer_and_starts_from_its_weights(tmp_path, ray_session):
    hf_model, vocab = write_checkpoint(tmp_path / "checkpoint", heads=True)
    cfg = tiny_config(tmp_path, [f"pretrain.init_from={tmp_path / 'checkpoint'}", "pretrain.max_steps=2",
                                 "pretrain.val_every_steps=2", "pipeline.stages=[bert_pretrain]"])
    run = TinyRun(cfg)
    for stage in ("prepare", "bert_tokenizer", "bert_examples"):
        run.run_stage(stage)
    tokenizer = load_tokenizer(run.stage_dir("bert_tokenizer"))
    assert tokenizer.get_vocab() == {piece: i for i, piece in enumerate(vocab)}
    assert tokenizer.encode("the captain found a letter").ids[0] == 101  # [CLS] where the checkpoint has it

    model = _build_model(cfg, cfg.pretrain, tokenizer.get_vocab_size())
    assert model.config.hidden_size == 32 and model.config.vocab_size == 192  # len(vocab) padded to 64s
    words = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(words[:len(vocab)], hf_model.bert.embeddings.word_embeddings.weight)
    assert torch.equal(model.bert.encoder.layer[1].output.dense.weight,
                       hf_model.bert.encoder.layer[1].output.dense.weight)
    assert torch.equal(model.cls.predictions.transform.dense.weight,
                       hf_model.cls.predictions.transform.dense.weight)
    assert torch.equal(model.cls.seq_relationship.weight, hf_model.cls.seq_relationship.weight)

    summary = run.run_stage("bert_pretrain")
    assert summary["steps"] == 2 and summary["num_parameters"] == sum(p.numel() for p in model.parameters())


def test_a_bare_encoder_gets_fresh_pretraining_heads(tmp_path):
    hf_model, vocab = write_checkpoint(tmp_path / "checkpoint", heads=False)
    model, loaded = continue_from_hf(tmp_path / "checkpoint", vocab_size=192)
    assert loaded == ["encoder"]
    assert torch.equal(model.bert.encoder.layer[0].attention.self.query.weight,
                       hf_model.encoder.layer[0].attention.self.query.weight)
    assert model.cls.predictions.bias.shape == (192,)


def test_a_directory_that_is_no_bert_checkpoint_fails_before_any_work(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        validate(tiny_config(tmp_path, [f"pretrain.init_from={tmp_path / 'empty'}"]))
    write_checkpoint(tmp_path / "checkpoint", heads=False)
    with pytest.raises(ValueError, match="longer than the positions"):
        validate(tiny_config(tmp_path, [f"pretrain.init_from={tmp_path / 'checkpoint'}",
                                        "examples.max_seq_length=128"]))


@pytest.mark.parametrize("removed, message", [
    ("model.safetensors", r"pretrain\.init_from=\S+ has a config\.json but no weights \(model\.safetensors or "
                          r"pytorch_model\.bin\); save the model there"),
    ("vocab.txt", r"pretrain\.init_from=\S+: \S+ has no tokenizer\.json or vocab\.txt; put the tokenizer files"),
])
def test_a_checkpoint_without_weights_or_tokenizer_fails_at_start_up(tmp_path, removed, message):
    """A directory with a config.json and without the weights (or the tokenizer) passed start-up, and failed only in
    bert_pretrain (bert_tokenizer), after the corpus had been prepared."""
    write_checkpoint(tmp_path / "checkpoint", heads=True)
    (tmp_path / "checkpoint" / removed).unlink()
    with pytest.raises(FileNotFoundError, match=message):
        validate(tiny_config(tmp_path, [f"pretrain.init_from={tmp_path / 'checkpoint'}"]))


def test_an_init_from_that_is_a_file_missing_or_another_familys_model_says_which(tmp_path):
    """A file or a path that does not exist was said to have "no config.json"; a GPT-2 directory without BERT's
    tokenizer files was refused for the tokenizer, not for being GPT-2."""
    (tmp_path / "weights.bin").write_bytes(b"")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=100,
                                                         bos_token_id=0, eos_token_id=0)).save_pretrained(
        tmp_path / "gpt2")
    for init_from, error, message in ((tmp_path / "weights.bin", FileNotFoundError, r"weights\.bin is a file;"),
                                      (tmp_path / "nowhere", FileNotFoundError, r"nowhere does not exist;"),
                                      (tmp_path / "gpt2", ValueError, r"gpt2 holds a 'gpt2' model; continued "
                                                                      r"pretraining starts from a BERT")):
        with pytest.raises(error, match=rf"^pretrain\.init_from=\S+{message}"):
            validate(tiny_config(tmp_path, [f"pretrain.init_from={init_from}"]))


def test_a_checkpoint_tokenizer_saved_truncating_and_padding_encodes_whole_texts(tmp_path):
    """all-MiniLM-L6-v2's tokenizer.json truncates and pads to 128: the examples stage, which encodes a shard's words
    in one call, failed ("11880 words came back as 613")."""
    from tokenizers.implementations import BertWordPieceTokenizer

    from data_prep.corpus.tokenizer import checkpoint_tokenizer

    _, vocab = write_checkpoint(tmp_path / "checkpoint", heads=False)
    saved = BertWordPieceTokenizer(str(tmp_path / "checkpoint" / "vocab.txt"), lowercase=True)
    saved.enable_truncation(8)
    saved.enable_padding(length=8)
    saved.save(str(tmp_path / "checkpoint" / "tokenizer.json"))
    tokenizer, _ = checkpoint_tokenizer(tmp_path / "checkpoint")
    text = " ".join(["the captain found a letter ."] * 5)
    assert len(tokenizer.encode(text).ids) == 2 + 6 * 5  # [CLS] ... [SEP], no piece cut, no padding
    assert len(tokenizer.encode("the book").ids) == 4
