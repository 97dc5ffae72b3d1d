"""Numerical parity with HuggingFace transformers' GPT2LMHeadModel, in both directions, on random weights."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from models.generation import greedy  # noqa: E402
from models.gpt import GPTConfig, GPTLMHeadModel  # noqa: E402
from models.hf.gpt import config_from_hf, from_hf, load_ours_or_hf, to_hf  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
SMALL = dict(vocab_size=99, n_positions=40, n_embd=64, n_layer=2, n_head=4)


def randomise_(model):
    # Both inits leave LayerNorms the identity and biases zero: random values show a swapped or untransposed tensor
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def input_ids(B=3, T=17):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(0))


def assert_same_logits(ours: GPTLMHeadModel, hf_model):
    ours.eval(), hf_model.eval()
    idx = input_ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, hf_model(input_ids=idx).logits, **TOL)


def hf_model(**overrides):
    config = transformers.GPT2Config(**{**SMALL, **overrides}, attn_implementation="eager")
    return randomise_(transformers.GPT2LMHeadModel(config))


def test_hf_to_ours(tmp_path):
    torch.manual_seed(0)
    hf = hf_model(layer_norm_epsilon=1e-6, eos_token_id=7)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert (ours.config.n_embd, ours.config.layer_norm_epsilon, ours.config.eos_token_id) == (64, 1e-6, 7)
    assert_same_logits(ours, hf)
    assert_same_logits(load_ours_or_hf(tmp_path), hf)  # what pipeline.generate reads


def test_a_small_vocabulary_model_saved_with_gpt2s_default_eos_loads_without_it(tmp_path):
    """Issue 39, defect 7: GPT2Config keeps eos_token_id=50256 whatever vocab_size is, and transformers loads such a
    model; from_hf refused it ("eos_token_id 50256 is outside the vocabulary")."""
    torch.manual_seed(0)
    hf = hf_model()  # SMALL's vocabulary of 99, and GPT2Config's default eos_token_id
    assert hf.config.eos_token_id == 50256
    hf.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="eos_token_id 50256 is outside the vocabulary of 99 tokens"):
        ours = from_hf(tmp_path)
    assert ours.config.eos_token_id is None
    assert_same_logits(ours, hf)


def test_hf_state_dicts_of_the_lm_and_of_the_bare_model():
    torch.manual_seed(0)
    hf = hf_model()
    config = GPTConfig(**SMALL)
    assert_same_logits(from_hf(hf.state_dict(), config), hf)
    assert_same_logits(from_hf(hf.transformer.state_dict(), config), hf)  # GPT2Model's keys, no `transformer.`
    # older GPT-2 checkpoints also store each layer's causal mask (and its fill value) as buffers
    old = {**hf.state_dict(), "transformer.h.0.attn.bias": torch.ones(1, 1, 40, 40).tril(),
           "transformer.h.0.attn.masked_bias": torch.tensor(-1e4)}
    assert_same_logits(from_hf(old, config), hf)
    with pytest.raises(ValueError, match="needs config"):
        from_hf(hf.state_dict())


def test_ours_to_hf(tmp_path):
    torch.manual_seed(0)
    # Non-default values wherever HF has a default, so a field missing from the exported config.json shows.
    config = GPTConfig(**SMALL, embd_pdrop=0.2, attn_pdrop=0.3, resid_pdrop=0.05, layer_norm_epsilon=1e-6,
                       initializer_range=0.03, eos_token_id=5)
    ours = randomise_(GPTLMHeadModel(config))
    to_hf(ours, tmp_path)
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager",
                                                            output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched: lm_head is tied on load
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    assert (hf.config.eos_token_id, hf.config.bos_token_id, hf.config.resid_pdrop) == (5, 5, 0.05)
    assert from_hf(tmp_path).config == config
    assert_same_logits(ours, hf)


def test_greedy_decoding_matches_hf_generate():
    torch.manual_seed(0)
    hf = hf_model().eval()
    ours = from_hf(hf.state_dict(), GPTConfig(**SMALL))
    prompt = [5, 17, 3, 42]
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    assert greedy(ours, [prompt], 12) == [expected[0, len(prompt):].tolist()]


@pytest.mark.parametrize("field,value", [("activation_function", "relu"), ("n_inner", 100),
                                         ("scale_attn_by_inverse_layer_idx", True), ("tie_word_embeddings", False)])
def test_configs_our_blocks_do_not_compute_are_rejected(field, value):
    hf = transformers.GPT2Config(**SMALL, **{field: value}).to_dict()
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        config_from_hf(hf)
