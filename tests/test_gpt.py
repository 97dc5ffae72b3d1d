"""models/gpt.py: the causal LM, its KV cache and its checkpoints."""
import math

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from models.gpt import (
    GPT_SIZES,
    GPTConfig,
    GPTLMHeadModel,
    KVCache,
    causal_mask,
    gpt_config,
    load_pretrained,
    save_pretrained,
)
from pipeline import CONF_DIR

V = 37


def tiny_model(vocab_size=V, scale=0.3, seed=0, **overrides) -> GPTLMHeadModel:
    """A 2-layer GPT with every parameter perturbed by N(0, scale^2): at GPT-2's init the next-token distribution is
    nearly uniform, which would hide a wrong position, a stale cache entry or a swapped beam."""
    torch.manual_seed(seed)
    config = GPTConfig(**{**dict(vocab_size=vocab_size, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                                 embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0), **overrides})
    model = GPTLMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def tokens(B, T, vocab_size=V, seed=0):
    return torch.randint(0, vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# Sizes, init, head, loss


@pytest.mark.parametrize("name,L,C,nh", [("gpt_tiny", 2, 128, 2), ("gpt_mini", 4, 256, 4), ("gpt_small", 12, 768, 12)])
def test_named_sizes(name, L, C, nh):
    c = gpt_config(name)
    assert (c.n_layer, c.n_embd, c.n_head) == (L, C, nh)
    assert set(GPT_SIZES) == {"gpt_tiny", "gpt_mini", "gpt_small"}


@pytest.mark.parametrize("name,n", [("gpt_tiny", 6_960_768), ("gpt_mini", 16_287_488), ("gpt_small", 124_439_808)])
def test_parameter_counts_with_gpt2_vocabulary(name, n):
    with torch.device("meta"):  # count without allocating or initialising
        model = GPTLMHeadModel(gpt_config(name))
    assert (model.config.vocab_size, model.config.n_positions) == (50257, 1024)
    assert sum(p.numel() for p in model.parameters()) == n  # gpt_small: GPT-2 small's 124M, the head tied


def test_gpt_config_overrides_and_validation():
    c = gpt_config("gpt_tiny", vocab_size=8000, eos_token_id=7)
    assert (c.vocab_size, c.eos_token_id, c.n_embd) == (8000, 7, 128)
    with pytest.raises(KeyError, match="gpt_huge"):
        gpt_config("gpt_huge")
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="eos_token_id"):
        GPTConfig(vocab_size=10, eos_token_id=10)
    with pytest.raises(ValueError, match="label_smoothing"):
        GPTConfig(label_smoothing=1.0)


@pytest.mark.parametrize("name", sorted(GPT_SIZES))
def test_model_configs_build_the_named_sizes(name):
    with initialize_config_dir(config_dir=str(CONF_DIR / "model"), version_base="1.3"):
        cfg = compose(config_name=name)
    cfg.config.vocab_size, cfg.config.eos_token_id = 500, 499  # the pipeline sets them from the trained tokenizer
    with torch.device("meta"):
        model = hydra.utils.instantiate(OmegaConf.to_container(cfg, resolve=True), _convert_="all")
    assert isinstance(model, GPTLMHeadModel) and model.config == gpt_config(name, vocab_size=500, eos_token_id=499)


def test_init_is_gpt2s_with_scaled_residual_projections():
    torch.manual_seed(0)
    model = GPTLMHeadModel(gpt_config("gpt_mini", vocab_size=2000))
    block = model.transformer.h[1]
    residual_std = 0.02 / math.sqrt(2 * 4)
    for linear, std in [(block.attn.c_attn, 0.02), (block.mlp.c_fc, 0.02),
                        (block.attn.c_proj, residual_std), (block.mlp.c_proj, residual_std)]:
        assert abs(linear.weight.std().item() - std) < 0.05 * std and linear.bias.abs().max() == 0
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.001
    assert abs(model.transformer.wpe.weight.std().item() - 0.02) < 0.001
    assert torch.equal(block.ln_1.weight, torch.ones(256)) and block.ln_1.bias.abs().max() == 0


def test_head_is_the_token_embedding_matrix():
    model = tiny_model()
    idx = tokens(2, 5)
    logits = model(idx).logits
    torch.testing.assert_close(logits, model.transformer(idx) @ model.transformer.wte.weight.t())
    assert "lm_head.weight" not in model.state_dict() and len(model.state_dict()) == len(dict(model.named_parameters()))


def hand_log_probs(logits):
    return logits - logits.exp().sum(-1, keepdim=True).log()


def test_loss_is_the_cross_entropy_of_the_next_token():
    model = tiny_model()
    idx, targets = tokens(3, 9), tokens(3, 9, seed=1)
    targets[1, 4:] = -100  # not scored
    out = model(idx, targets)
    log_probs = hand_log_probs(out.logits.double())
    scored = targets != -100
    nll = -log_probs[scored].gather(-1, targets[scored][:, None]).mean()
    assert out.logits.shape == (3, 9, V)
    assert abs(out.loss.item() - nll.item()) < 1e-5
    assert model(idx).loss is None


def test_label_smoothing_applies_in_training_only():
    model = tiny_model(label_smoothing=0.1)
    idx, targets = tokens(2, 7), tokens(2, 7, seed=1)
    eval_loss = model(idx, targets).loss
    model.train()  # no dropout in tiny_model: the logits are the same
    train_out = model(idx, targets)
    log_probs = hand_log_probs(train_out.logits.double()).flatten(0, 1)
    nll = -log_probs.gather(-1, targets.flatten()[:, None]).mean()
    uniform = -log_probs.mean()  # cross-entropy against the uniform distribution
    assert abs(eval_loss.item() - nll.item()) < 1e-5  # exp(eval loss) is the perplexity
    assert abs(train_out.loss.item() - (0.9 * nll + 0.1 * uniform).item()) < 1e-5


def test_changing_a_future_token_changes_no_earlier_logits():
    model = tiny_model()
    idx = tokens(2, 12)
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % V
    before, after = model(idx).logits, model(changed).logits
    torch.testing.assert_close(before[:, :7], after[:, :7], atol=1e-6, rtol=0)
    assert (before[:, 7:] - after[:, 7:]).abs().amax(-1).min() > 1e-3  # every later position sees it


def test_longer_than_the_context_is_an_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="n_positions=24"):
        model(tokens(1, 25))


# -----------------------------------------------------------------------------
# KV cache


def test_cached_decoding_gives_the_uncached_logits_step_by_step():
    model = tiny_model()
    idx = tokens(2, 20)
    full = model(idx).logits  # (B, T, V)
    cache = model.new_cache(2, 20)
    # a prompt (no past: is_causal), a chunk after a past (explicit mask), then one token at a time (no mask)
    pieces = [(0, 6), (6, 9)] + [(t, t + 1) for t in range(9, 20)]
    for start, end in pieces:
        step = model(idx[:, start:end], cache=cache).logits
        torch.testing.assert_close(step, full[:, start:end], atol=1e-5, rtol=0)
    assert cache.length == 20


def test_cache_longer_than_allocated_is_an_error():
    model = tiny_model()
    cache = model.new_cache(1, 4)
    model(tokens(1, 4), cache=cache)
    with pytest.raises(ValueError, match="KV cache holds 4 positions"):
        model(tokens(1, 1), cache=cache)


def test_left_padded_rows_decode_as_they_would_alone():
    model = tiny_model()
    prompts = [tokens(1, 7, seed=1)[0], tokens(1, 3, seed=2)[0], tokens(1, 5, seed=3)[0]]
    pad = torch.tensor([0, 4, 2])
    batch = torch.stack([torch.cat([torch.zeros(p, dtype=torch.long), x]) for p, x in zip(pad, prompts)])  # (3, 7)
    nxt = tokens(3, 1, seed=4)
    cache = model.new_cache(3, 8, pad)
    first = model(batch, cache=cache).logits[:, -1]
    second = model(nxt, cache=cache).logits[:, -1]
    for row, prompt in enumerate(prompts):
        alone = model(torch.cat([prompt, nxt[row]])[None]).logits[0]
        torch.testing.assert_close(first[row], alone[-2], atol=1e-5, rtol=0)
        torch.testing.assert_close(second[row], alone[-1], atol=1e-5, rtol=0)


def test_causal_mask_with_left_padding():
    mask = causal_mask(past=0, T=4, pad=torch.tensor([0, 2]))  # (B, 1, T, S)
    assert mask[0, 0].tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()
    # row 1's padding queries see only themselves, its real queries only real keys
    assert mask[1, 0].int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    step = causal_mask(past=4, T=1, pad=torch.tensor([0, 2]))
    assert step[:, 0, 0].int().tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert causal_mask(past=0, T=4, pad=None) is None and causal_mask(past=4, T=1, pad=None) is None


def test_reorder_moves_and_duplicates_rows():
    model = tiny_model()
    idx = tokens(3, 5)
    cache = model.new_cache(3, 6)
    model(idx, cache=cache)
    cache.reorder(torch.tensor([2, 2, 0]))
    nxt = tokens(3, 1, seed=1)
    step = model(nxt, cache=cache).logits[:, -1]
    for row, source in enumerate([2, 2, 0]):
        alone = model(torch.cat([idx[source], nxt[row]])[None]).logits[0, -1]
        torch.testing.assert_close(step[row], alone, atol=1e-5, rtol=0)


def test_kv_cache_shape():
    cache = KVCache(gpt_config("gpt_tiny", vocab_size=10), batch_size=3, max_len=9)
    assert cache.k.shape == cache.v.shape == (2, 3, 2, 9, 64) and cache.length == 0


# -----------------------------------------------------------------------------
# Checkpoints


def test_save_and_load_pretrained_round_trip(tmp_path):
    model = tiny_model(eos_token_id=2, label_smoothing=0.1)
    save_pretrained(model, tmp_path / "gpt")
    loaded = load_pretrained(tmp_path / "gpt").eval()
    assert loaded.config == model.config
    idx = tokens(2, 6)
    assert torch.equal(loaded(idx).logits, model(idx).logits)


def test_load_pretrained_rejects_another_format(tmp_path):
    from models.bert import BertConfig, BertModel, save_encoder
    save_encoder(BertModel(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=8)), tmp_path)
    with pytest.raises(ValueError, match="neither a textrep-gpt checkpoint nor a HuggingFace GPT-2 config"):
        load_pretrained(tmp_path)
