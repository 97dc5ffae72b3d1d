"""models/gpt.py and models/generation.py: the causal LM, its KV cache, and greedy / sampling / beam-search decoding."""
import itertools
import math
import unittest.mock

import hydra
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from models import IGNORE_INDEX
from models.generation import beam_search, filter_logits, greedy, length_penalty, repeated_ngram_tokens, sample
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
    targets[1, 4:] = IGNORE_INDEX  # not scored
    out = model(idx, targets)
    log_probs = hand_log_probs(out.logits.double())
    scored = targets != IGNORE_INDEX
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


def test_label_smoothing_is_off_by_default():
    """Every named size, and the pipeline's model configs, train on the plain next-token cross-entropy unless asked."""
    assert all(gpt_config(name).label_smoothing == 0.0 for name in GPT_SIZES)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in ("gpt_tiny", "gpt_mini", "gpt_small"):
            cfg = compose(config_name="config", overrides=[f"model={name}"])
            assert OmegaConf.select(cfg, "model.config.label_smoothing", default=0.0) == 0.0, name
    model = tiny_model().train()  # no dropout in tiny_model
    idx, targets = tokens(2, 7), tokens(2, 7, seed=1)
    out = model(idx, targets)
    nll = F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
    assert abs(out.loss.item() - nll.item()) < 1e-6


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


def test_next_token_logits_are_the_last_positions_logits_and_fill_the_cache():
    """What a decoding step reads: the head on the last position alone (over a prompt, forward() scores them all)."""
    model = tiny_model()
    idx = tokens(2, 9)
    full = model(idx).logits  # (B, T, V)
    cache = model.new_cache(2, 9)
    torch.testing.assert_close(model.next_token_logits(idx[:, :6], cache), full[:, 5], atol=1e-5, rtol=0)
    for t in range(6, 9):
        torch.testing.assert_close(model.next_token_logits(idx[:, t:t + 1], cache), full[:, t], atol=1e-5, rtol=0)
    assert cache.length == 9


def test_decoding_reads_the_embeddings_as_they_are_now_after_a_training_step_or_a_load():
    """Decoding keeps nothing derived from the weights between calls: a training step or a load shows at once."""
    model = tiny_model()
    idx = tokens(1, 5)

    def decoded_and_full():
        return model.next_token_logits(idx, model.new_cache(1, 5)), model(idx).logits[:, -1]

    first, _ = decoded_and_full()
    model(idx, idx).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    after_step, full = decoded_and_full()
    assert not torch.allclose(after_step, first, atol=1e-3)
    torch.testing.assert_close(after_step, full, atol=1e-5, rtol=0)
    model.load_state_dict(tiny_model(seed=1).state_dict())  # copied into the same tensors
    after_load, full = decoded_and_full()
    torch.testing.assert_close(after_load, full, atol=1e-5, rtol=0)


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
    from models.bert import BertConfig, BertModel
    from models.bert import save_pretrained as save_bert
    from models.hf.gpt import load_ours_or_hf
    save_bert(BertModel(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=8)), tmp_path)
    with pytest.raises(ValueError, match="is not a textrep-gpt checkpoint"):
        load_pretrained(tmp_path)
    with pytest.raises(ValueError, match="neither a textrep-gpt checkpoint nor a HuggingFace GPT-2 config"):
        load_ours_or_hf(tmp_path)


# -----------------------------------------------------------------------------
# Greedy and sampling


def uncached_greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_is_the_argmax_continuation_for_a_batch_of_unequal_prompts():
    model = tiny_model()
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8, 9]]
    out = greedy(model, prompts, 8)
    assert out == [uncached_greedy(model, p, 8) for p in prompts]
    assert out == [greedy(model, [p], 8)[0] for p in prompts]


def test_greedy_stops_each_row_at_eos():
    model = tiny_model()
    prompts = [[1, 2, 3], [4, 5]]
    free = greedy(model, prompts, 10)
    eos = free[0][3]
    assert eos not in free[0][:3] and eos not in free[1]  # the seed gives a row that ends and one that does not
    model.config.eos_token_id = eos
    out = greedy(model, prompts, 10)
    assert out == [free[0][:4], free[1]]
    model.config.eos_token_id = free[0][0]
    assert greedy(model, prompts[:1], 10) == [free[0][:1]]


def test_generation_runs_without_dropout_and_restores_the_mode():
    model = tiny_model(embd_pdrop=0.5, attn_pdrop=0.5, resid_pdrop=0.5)
    expected = greedy(model, [[1, 2, 3]], 6)
    model.train()
    assert greedy(model, [[1, 2, 3]], 6) == expected and model.training


def test_zero_new_tokens():
    assert greedy(tiny_model(), [[1, 2], [3]], 0) == [[], []]
    assert [h.tokens for h in beam_search(tiny_model(), [1, 2], 0, num_beams=2)] == [[]]


def test_filter_logits_top_k_and_nucleus():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    inf = float("-inf")
    assert filter_logits(logits, top_k=2)[0, 2:].tolist() == [inf, inf]
    assert filter_logits(logits, top_k=2)[0, :2].tolist() == logits[0, :2].tolist()
    # the nucleus is the smallest set reaching p: 0.5 + 0.3 reaches 0.8, 0.5 + 0.3 + 0.15 is needed for 0.81
    assert filter_logits(logits, top_p=0.8).isinf().tolist() == [[False, False, True, True]]
    assert filter_logits(logits, top_p=0.81).isinf().tolist() == [[False, False, False, True]]
    assert filter_logits(logits, top_p=0.01).isinf().tolist() == [[False, True, True, True]]
    shuffled = logits[:, [2, 0, 3, 1]]  # the nucleus is found in vocabulary order, whatever it is
    assert filter_logits(shuffled, top_p=0.8).isinf().tolist() == [[True, False, True, False]]


def test_sampling_draws_from_the_tempered_filtered_distribution():
    model = tiny_model(scale=0.1)
    prompt = [3, 1, 4]
    logits = model(torch.tensor([prompt])).logits[0, -1]
    n = 20000
    draws = sample(model, [prompt] * n, 1, temperature=0.7, top_k=10, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(torch.tensor(draws).flatten(), minlength=V).double()
    expected = filter_logits((logits / 0.7)[None], top_k=10)[0].softmax(-1).double()
    assert (counts[expected == 0] == 0).all()
    assert (counts / n - expected).abs().max() < 4 * math.sqrt(0.25 / n)  # 4 standard deviations at worst


def test_sampling_is_reproducible_from_its_generator_alone():
    model = tiny_model()
    prompts = [[1, 2, 3], [4]]
    state = torch.get_rng_state()
    a = sample(model, prompts, 10, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is not drawn from
    torch.manual_seed(123)
    assert sample(model, prompts, 10, generator=torch.Generator().manual_seed(5)) == a
    assert sample(model, prompts, 10, generator=torch.Generator().manual_seed(6)) != a


def test_sampling_with_one_candidate_is_greedy():
    model = tiny_model()
    prompts = [[1, 2, 3], [4]]
    g = torch.Generator().manual_seed(0)
    assert sample(model, prompts, 8, top_k=1, generator=g) == greedy(model, prompts, 8)
    assert sample(model, prompts, 8, top_p=1e-6, generator=g) == greedy(model, prompts, 8)


# -----------------------------------------------------------------------------
# Beam search


def test_gnmt_length_penalty():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.0) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)


def test_one_beam_is_greedy():
    model = tiny_model()
    prompt = [5, 6, 7]
    free = greedy(model, [prompt], 10)[0]
    for alpha in (0.0, 0.6, 2.0):  # without an end token every hypothesis has the same length
        [best] = beam_search(model, prompt, 10, num_beams=1, alpha=alpha)
        assert best.tokens == free and not best.finished
    model.config.eos_token_id = free[4]
    assert free[4] not in free[:4]
    [best] = beam_search(model, prompt, 10, num_beams=1, alpha=0.0)
    assert best.tokens == free[:5] == greedy(model, [prompt], 10)[0] and best.finished
    # Two tokens, one the end: the end is often the runner-up, and a beam of one must not keep it as finished
    for seed in range(12):
        model = tiny_model(vocab_size=2, scale=0.5, seed=seed, eos_token_id=0)
        [best] = beam_search(model, [1, 1], 8, num_beams=1, alpha=0.0)
        assert best.tokens == greedy(model, [[1, 1]], 8)[0], seed


def sequence_log_prob(model, prompt, continuation) -> float:
    seq = torch.tensor([list(prompt) + list(continuation)])
    log_probs = model(seq).logits[0].double().log_softmax(-1)
    return sum(log_probs[len(prompt) - 1 + i, t].item() for i, t in enumerate(continuation))


def repeats_an_ngram(seq: tuple, n: int) -> bool:
    ngrams = [seq[i:i + n] for i in range(len(seq) - n + 1)]
    return n > 0 and len(set(ngrams)) < len(ngrams)


def exhaustive(model, prompt, max_new_tokens, alpha, no_repeat_ngram_size=0) -> list[tuple[float, tuple]]:
    """(score, continuation) of every continuation: ended by the end token, or max_new_tokens long, and repeating no
    n-gram of size no_repeat_ngram_size; best first."""
    eos, vocab = model.config.eos_token_id, range(model.config.vocab_size)
    scored = []
    for n in range(1, max_new_tokens + 1):
        for seq in itertools.product(vocab, repeat=n):
            ends_wrong = eos in seq[:-1] or (n < max_new_tokens and seq[-1] != eos)
            if ends_wrong or repeats_an_ngram(seq, no_repeat_ngram_size):
                continue
            scored.append((sequence_log_prob(model, prompt, seq) / length_penalty(n, alpha), seq))
    return sorted(scored, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_search_finds_the_best_sequence(alpha):
    """V=5, 3 steps: 125 beams keep every prefix, so beam search must return the exhaustive optimum."""
    model = tiny_model(vocab_size=5, scale=1.0, eos_token_id=0)
    prompt = [1, 2]
    reference = exhaustive(model, prompt, 3, alpha)
    found = beam_search(model, prompt, 3, num_beams=125, alpha=alpha)
    for hypothesis, (score, seq) in zip(found, reference[:10]):
        assert tuple(hypothesis.tokens) == seq and hypothesis.score == pytest.approx(score, abs=1e-4)
        assert hypothesis.finished == (seq[-1] == 0)
        assert hypothesis.log_prob == pytest.approx(sequence_log_prob(model, prompt, seq), abs=1e-4)
    assert any(h.finished for h in found[:3]) and not all(h.finished for h in found[:10])


@pytest.mark.parametrize("n", [1, 2])
def test_ngram_blocking_finds_the_best_sequence_that_repeats_no_ngram(n):
    """V=4, 4 steps, 256 beams: with no_repeat_ngram_size=n beam search must return the exhaustive optimum among the
    continuations that repeat no n-gram (the prompt's n-grams may be repeated), and without it a repeating one wins."""
    model = tiny_model(vocab_size=4, scale=1.5, seed=1, eos_token_id=0)
    prompt = [1, 2]
    assert repeats_an_ngram(tuple(beam_search(model, prompt, 4, num_beams=256, alpha=0.0)[0].tokens), n)
    reference = exhaustive(model, prompt, 4, 0.0, no_repeat_ngram_size=n)
    found = beam_search(model, prompt, 4, num_beams=256, alpha=0.0, no_repeat_ngram_size=n)
    assert [tuple(h.tokens) for h in found[:8]] == [seq for _, seq in reference[:8]]
    assert not any(repeats_an_ngram(tuple(h.tokens), n) for h in found)
    assert repeated_ngram_tokens([5, 6, 5, 6, 5], 3) == [6] and repeated_ngram_tokens([5, 6, 7], 2) == []
    assert repeated_ngram_tokens([5, 5], 1) == [5, 5] and repeated_ngram_tokens([5, 6], 0) == []


def test_beam_search_stops_early_only_when_nothing_can_beat_the_finished():
    """Two tokens, one the end: every continuation is 1^k then the end, or 1^8, and 2 beams hold them all (one live,
    the rest finished), so beam search must return the best two however early it stops. Among these seeds, one
    (scale 0.5, alpha 2, seed 3) has a live beam that overtakes the finished ones only at the longest length's
    penalty: a bound at the next length's would stop too early."""
    stopped_early = 0
    for scale, alpha, seed in itertools.product((0.5, 1.5), (0.0, 1.0, 2.0), range(12)):
        model = tiny_model(vocab_size=2, scale=scale, seed=seed, eos_token_id=0)
        forward = model.transformer.forward
        with unittest.mock.patch.object(model.transformer, "forward", side_effect=forward) as calls:
            found = beam_search(model, [1, 1], 8, num_beams=2, alpha=alpha)
        stopped_early += calls.call_count < 8  # the prompt, then fewer than 7 more steps
        log_probs = model(torch.tensor([[1, 1] + [1] * 8])).logits[0, 1:].double().log_softmax(-1)  # (9, 2)
        ones = [0.0] + log_probs[:, 1].cumsum(0).tolist()  # log P(1^k)
        reference = [((ones[k] + log_probs[k, 0].item()) / length_penalty(k + 1, alpha), (1,) * k + (0,))
                     for k in range(8)]
        reference = sorted(reference + [(ones[8] / length_penalty(8, alpha), (1,) * 8)], reverse=True)
        assert [tuple(h.tokens) for h in found] == [seq for _, seq in reference[:2]], (scale, alpha, seed)
        # fp32 scores of KV-cached steps against a full forward's log-softmax in float64: on the AMX Xeon, whose
        # kernels sum in another order, they differed by up to 8.7e-6 relative (3.2e-4 at a score of -36.5) and 2.2e-5
        # absolute (at -2.1)
        assert [h.score for h in found] == pytest.approx([score for score, _ in reference[:2]], rel=2e-5, abs=1e-4)
    assert stopped_early >= 20


def test_beam_hypotheses_score_what_the_model_assigns():
    model = tiny_model(eos_token_id=3)
    prompt = [4, 5, 6]
    found = beam_search(model, prompt, 12, num_beams=4, alpha=0.6)
    assert len(found) == 4 and [h.score for h in found] == sorted([h.score for h in found], reverse=True)
    for h in found:
        assert h.log_prob == pytest.approx(sequence_log_prob(model, prompt, h.tokens), abs=1e-4)
        assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens), 0.6))
        assert h.finished == (h.tokens[-1] == 3) and 3 not in h.tokens[:-1]


# -----------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("call,argument", [
    (lambda m: greedy(m, [[]], 5), "prompt is empty"),
    (lambda m: greedy(m, [], 5), "prompts is empty"),
    (lambda m: greedy(m, [1, 2, 3], 5), "prompts is a list of prompts"),
    (lambda m: greedy(m, [[1] * 25], 0), "prompt of 25 tokens is longer than the model's context n_positions=24"),
    (lambda m: greedy(m, [[1] * 20], 5), "max_new_tokens=5 .* ask for at most 4"),
    (lambda m: greedy(m, [[1]], -1), "max_new_tokens must be >= 0"),
    (lambda m: sample(m, [[1]], 5, temperature=0.0), "temperature must be > 0"),
    (lambda m: sample(m, [[1]], 5, top_k=0), "top_k must be >= 1"),
    (lambda m: sample(m, [[1]], 5, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (lambda m: beam_search(m, [1], 5, num_beams=0), "num_beams must be >= 1"),
    (lambda m: beam_search(m, [], 5), "prompt is empty"),
    (lambda m: beam_search(m, [1] * 25, 5), "longer than the model's context"),
    (lambda m: beam_search(m, [1], -2), "max_new_tokens must be >= 0"),
])
def test_bad_requests_are_one_line_errors(call, argument):
    with pytest.raises(ValueError, match=argument) as error:
        call(tiny_model())
    assert "\n" not in str(error.value)


