"""models/seq2seq.py and models/rnn_seq2seq.py: the Transformer and RNN encoder-decoders, their label-smoothed loss,
and their decoding through models/generation.py (KV cache, memory computed once, greedy, beam search). The copy task:
tests/seq2seq/test_seq2seq_copy.py; BART parity: tests/seq2seq/test_seq2seq_hf_parity.py."""
from __future__ import annotations

import math
import unittest.mock
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from models import IGNORE_INDEX, kernels
from models.generation import beam_search, greedy, sample
from models.rnn_seq2seq import (
    ATTENTIONS,
    RNN_SEQ2SEQ_SIZES,
    RNNEncoderDecoder,
    RNNSeq2SeqConfig,
    rnn_seq2seq_config,
)
from models.rnn_seq2seq import load_pretrained as load_rnn
from models.rnn_seq2seq import save_pretrained as save_rnn
from models.seq2seq import (
    BART_OPTIONS,
    SEQ2SEQ_SIZES,
    Attention,
    EncoderDecoder,
    Generator,
    LabelSmoothing,
    Seq2SeqConfig,
    greedy_decode,
    load_pretrained,
    pad_sources,
    save_pretrained,
    seq2seq_config,
    shift_right,
    subsequent_mask,
)
from tests.models.test_kernels import assert_same, count_gemv_calls, on_and_off
from tests.seq2seq.test_seq2seq_copy import copy_batch

V = 13  # the copy task's vocabulary: padding 0, start 1, end 2, symbols 3..12
SOURCES = [[5, 6, 7, 8, 9], [10, 11, 12], [3], [4, 4, 5, 5, 6, 6, 7, 7, 8, 8]]
TRANSFORMER_VARIANTS = {"seed 000": {}, "post-LN": dict(pre_layer_norm=False), "BART": BART_OPTIONS,
                        "copy attention": dict(copy_attention=True)}


TRANSFORMER = Seq2SeqConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, n_head=4, d_ff=64,
                            max_positions=24, dropout=0.0, label_smoothing=0.0)
RNN = RNNSeq2SeqConfig(vocab_size=V, embedding_dim=16, hidden_size=32, num_layers=2, dropout=0.0)


def transformer(**overrides) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(replace(TRANSFORMER, **overrides))


def rnn(**overrides) -> RNNEncoderDecoder:
    torch.manual_seed(0)
    return RNNEncoderDecoder(replace(RNN, **overrides))


def half_trained(model, steps: int = 60):
    """`model` after a few copy-task steps: a random model repeats one token forever, which would hide a wrong position,
    a stale cache entry or a swapped beam; this one starts to copy, varies its tokens and ends some targets."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        source, decoder_inputs, targets = copy_batch(generator, 32)
        model(source, decoder_inputs, targets=targets).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.fixture(scope="module", params=list(TRANSFORMER_VARIANTS))
def trained_transformer(request):
    return half_trained(transformer(**TRANSFORMER_VARIANTS[request.param]))


RNN_VARIANTS = {"lstm-additive": dict(cell="lstm", attention="additive"),
                "gru-dot-no input feeding": dict(cell="gru", attention="dot", input_feeding=False),
                "gru-general": dict(cell="gru", attention="general"),
                "lstm-additive-copy attention": dict(cell="lstm", attention="additive", copy_attention=True)}


@pytest.fixture(scope="module", params=list(RNN_VARIANTS))
def trained_rnn(request):
    return half_trained(rnn(**RNN_VARIANTS[request.param]))


# -----------------------------------------------------------------------------
# Sizes and structure


def test_named_sizes():
    base = seq2seq_config("transformer_base")
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.n_head, base.d_ff) == (6, 6, 512, 8, 2048)
    assert set(SEQ2SEQ_SIZES) == {"seq2seq_tiny", "seq2seq_small", "transformer_base"}
    assert set(RNN_SEQ2SEQ_SIZES) == {"rnn_attn_tiny", "rnn_attn_small"}
    assert rnn_seq2seq_config("rnn_attn_tiny", vocab_size=99).vocab_size == 99
    with pytest.raises(KeyError, match="unknown seq2seq size"):
        seq2seq_config("seq2seq_huge")


def test_transformer_base_has_the_papers_parameter_count():
    """Vaswani et al. Table 3: 65M parameters for the base model with its shared 37000-token vocabulary. Counted by
    hand: the shared embedding, 4 projections and the 512 -> 2048 -> 512 feed-forward per layer (the decoder's 4 more
    for attention over the memory), their biases and LayerNorms, the stacks' final LayerNorms and the output bias."""
    d, f, vocab = 512, 2048, 37000
    attention = 4 * (d * d + d)
    feed_forward = d * f + f + f * d + d
    encoder_layer = attention + feed_forward + 2 * 2 * d
    decoder_layer = 2 * attention + feed_forward + 3 * 2 * d
    expected = vocab * d + 6 * encoder_layer + 6 * decoder_layer + 2 * 2 * d + vocab
    model = EncoderDecoder(seq2seq_config("transformer_base", vocab_size=vocab))
    assert sum(p.numel() for p in model.parameters()) == expected
    assert round(expected / 1e6) == 63  # 65M in the paper, which does not say how it counted


@pytest.mark.parametrize("field,value,message", [
    ("n_head", 5, "not a multiple of n_head"), ("activation", "swish", "activation must be one of"),
    ("position_embedding_type", "relative", "position_embedding_type must be one of"),
    ("eos_token_id", 13, "eos_token_id 13 is outside the vocabulary"), ("label_smoothing", 1.0, "label_smoothing"),
])
def test_bad_configs_are_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        Seq2SeqConfig(**{"vocab_size": V, "d_model": 32, "n_head": 4, field: value})


@pytest.mark.parametrize("field,value,message", [("cell", "rnn", "cell must be one of"),
                                                 ("attention", "cosine", "attention must be one of"),
                                                 ("hidden_size", 33, "hidden_size must be even")])
def test_bad_rnn_configs_are_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        RNNSeq2SeqConfig(**{"vocab_size": V, field: value})


def test_subsequent_mask_is_seed_000s():
    assert subsequent_mask(5).int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                                 [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert subsequent_mask(2, past=3).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_one_embedding_matrix_embeds_both_sides_and_scores_the_output():
    model = transformer()
    embeddings = [name for name, p in model.named_parameters() if p.shape == (V, 32)]
    assert embeddings == ["shared.weight"]
    source, decoder_inputs, _ = copy_batch(torch.Generator().manual_seed(0), 2)
    states = model.decode(decoder_inputs, model.encode(source)).states
    torch.testing.assert_close(model(source, decoder_inputs).logits, states @ model.shared.weight.t())


def test_sinusoidal_positions_are_fixed_and_learned_ones_read_past_the_offset():
    model = transformer()
    table = model.encoder.embed_positions.table
    assert not any("embed_positions" in name for name, _ in model.named_parameters())
    assert "encoder.embed_positions.table" not in model.state_dict()
    assert table[3, 0] == pytest.approx(math.sin(3)) and table[3, 1] == pytest.approx(math.cos(3))
    bart = transformer(**BART_OPTIONS)
    positions = bart.decoder.embed_positions
    assert positions.weight.shape == (24 + 2, 32)
    torch.testing.assert_close(positions(past=4, T=3), positions.weight[6:9])


def reference_layer(layer, x, pre_ln: bool):
    """An encoder layer as Vaswani et al. (post-LN) or seed 000 (pre-LN) write it, attention by hand."""
    def attention(h):
        a = layer.self_attn
        B, T, C = h.shape
        q, k, v = (p(h).view(B, T, a.n_head, -1).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        probs = (q @ k.transpose(-1, -2) / math.sqrt(C // a.n_head)).softmax(-1)
        return a.out_proj((probs @ v).transpose(1, 2).reshape(B, T, C))

    def feed_forward(h):
        return layer.fc2(F.relu(layer.fc1(h)))

    norm1, norm2 = layer.self_attn_layer_norm, layer.final_layer_norm
    if pre_ln:
        x = x + attention(norm1(x))
        return x + feed_forward(norm2(x))
    x = norm1(x + attention(x))
    return norm2(x + feed_forward(x))


@pytest.mark.parametrize("pre_ln", [True, False])
def test_pre_and_post_layer_norm_blocks(pre_ln):
    model = transformer(pre_layer_norm=pre_ln).eval()
    layer = model.encoder.layers[0]
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(layer(x, None), reference_layer(layer, x, pre_ln))
    assert isinstance(model.encoder.layer_norm, torch.nn.LayerNorm) == pre_ln  # pre-LN's final LayerNorm per stack


@pytest.mark.parametrize("variant", list(TRANSFORMER_VARIANTS))
def test_changing_a_later_target_token_changes_no_earlier_logits(variant):
    model = half_trained(transformer(**TRANSFORMER_VARIANTS[variant]), steps=5)
    source, decoder_inputs, _ = copy_batch(torch.Generator().manual_seed(1), 2)
    changed = decoder_inputs.clone()
    changed[:, 6] = (changed[:, 6] + 1) % V
    with torch.no_grad():
        a, b = model(source, decoder_inputs).logits, model(source, changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("make", [transformer, rnn], ids=["transformer", "rnn"])
def test_a_padded_source_reads_as_it_would_alone(make):
    model = half_trained(make(), steps=5)
    ids, mask = pad_sources([[5, 6, 7], [8, 9, 10, 11, 12, 3]], pad_token_id=0)
    decoder_inputs = torch.tensor([[1, 4, 5, 6], [1, 7, 8, 9]])
    with torch.no_grad():
        batched = model(ids, decoder_inputs, mask).logits
        alone = model(ids[:1, :3], decoder_inputs[:1]).logits
        changed_padding = model(ids.masked_fill(mask == 0, 7), decoder_inputs, mask).logits
    torch.testing.assert_close(batched[:1], alone)
    torch.testing.assert_close(changed_padding, batched)


# -----------------------------------------------------------------------------
# Loss


def test_shift_right_is_teacher_forcing():
    targets = torch.tensor([[5, 6, 2, IGNORE_INDEX], [7, 2, IGNORE_INDEX, IGNORE_INDEX]])
    assert shift_right(targets, 1, 0).tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_is_the_smoothed_cross_entropy_less_the_targets_entropy(eps):
    torch.manual_seed(0)
    logits = torch.randn(12, 7) * 3
    target = torch.randint(0, 7, (12,))
    target[[2, 5, 11]] = IGNORE_INDEX
    q_high, q_low = 1 - eps + eps / 7, eps / 7
    entropy = -(q_high * math.log(q_high) + (6 * q_low * math.log(q_low) if eps else 0.0))
    cross_entropy = F.cross_entropy(logits, target, label_smoothing=eps)  # ignore_index=IGNORE_INDEX by default
    loss = LabelSmoothing(eps)(logits, target)
    assert loss.item() == pytest.approx(cross_entropy.item() - entropy, abs=1e-5)
    # and seed 000's form: KLDivLoss against the smoothed distribution written out, over the scored tokens
    scored = target != IGNORE_INDEX
    q = torch.full((int(scored.sum()), 7), q_low).scatter_(1, target[scored, None], q_high)
    kl = F.kl_div(logits[scored].log_softmax(-1), q, reduction="sum") / scored.sum()
    assert loss.item() == pytest.approx(kl.item(), abs=1e-5)
    assert LabelSmoothing(eps)(logits, target, smoothed=False).item() == pytest.approx(
        F.cross_entropy(logits, target).item(), abs=1e-6)


def test_label_smoothing_is_zero_at_the_smoothed_target_and_ignores_padding():
    eps, vocab = 0.2, 5
    target = torch.tensor([1, 3, IGNORE_INDEX])
    q = torch.full((3, vocab), eps / vocab).scatter_(1, torch.tensor([[1], [3], [0]]), 1 - eps + eps / vocab)
    logits = q.log()
    logits[2] = torch.tensor([9.0, -9.0, 0.0, 3.0, 1.0])  # the padding row: anything
    assert LabelSmoothing(eps)(logits, target).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("make", [transformer, rnn], ids=["transformer", "rnn"])
def test_the_training_loss_is_smoothed_and_the_eval_loss_is_the_cross_entropy(make):
    model = make(label_smoothing=0.1)
    source, decoder_inputs, targets = copy_batch(torch.Generator().manual_seed(0), 4)
    targets[0, 8:] = IGNORE_INDEX
    model.eval()
    out = model(source, decoder_inputs, targets=targets)
    assert out.loss.item() == pytest.approx(F.cross_entropy(out.logits.flatten(0, 1), targets.flatten()).item(),
                                            rel=1e-5)
    model.train()
    out = model(source, decoder_inputs, targets=targets)
    expected = LabelSmoothing(0.1)(out.logits.flatten(0, 1), targets.flatten())
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)


# -----------------------------------------------------------------------------
# Decoding


def test_cached_steps_give_the_teacher_forced_logits(trained_transformer):
    """Every position of a target decoded one token at a time with the KV cache and the memory's keys and values
    computed once equals the whole target run at once (no cache)."""
    model = trained_transformer
    ids, mask = pad_sources(SOURCES[:2], 0)
    decoder_inputs = torch.tensor([[1, 5, 6, 7, 8, 9, 4], [1, 10, 11, 12, 2, 3, 3]])
    with torch.no_grad():
        full = model(ids, decoder_inputs, mask).logits
        memory, cache = model.encode(ids, mask), model.new_cache(2, 7)
        steps = torch.stack([model.next_token_logits(decoder_inputs[:, t: t + 1], memory, cache)
                             for t in range(7)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_cached_greedy_is_seed_000s_greedy_decode(trained_transformer):
    model = trained_transformer
    out = greedy(model, SOURCES, 12)
    assert len({tuple(row) for row in out}) == len(SOURCES) and any(row[-1] == 2 for row in out)  # varied, some end
    ids, mask = pad_sources(SOURCES, 0)
    uncached = greedy_decode(model, ids, mask, 13, start_symbol=1)[:, 1:].tolist()
    assert out == [row[: row.index(2) + 1] if 2 in row else row for row in uncached]
    assert out == [greedy(model, [source], 12)[0] for source in SOURCES]  # a batch decodes as its rows alone


def test_the_memorys_keys_and_values_are_computed_once_per_source(trained_transformer):
    model = trained_transformer
    with unittest.mock.patch.object(Attention, "keys_values", autospec=True,
                                    side_effect=Attention.keys_values) as calls:
        greedy(model, SOURCES, 10)
        assert calls.call_count == model.config.decoder_layers
        calls.reset_mock()
        beam_search(model, SOURCES[0], 10, num_beams=4)
        assert calls.call_count == model.config.decoder_layers


def test_beams_of_one_source_attend_to_its_memory_as_copies_of_it_would(trained_transformer):
    attention = trained_transformer.decoder.layers[1].encoder_attn
    memory, x = torch.randn(1, 6, 32), torch.randn(3, 1, 32)
    mask = torch.tensor([[[[True] * 5 + [False]]]])
    with torch.no_grad():
        k, v = attention.keys_values(memory)
        shared = attention.cross(x, k, v, mask, need_weights=True)
        copied = attention.cross(x, k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1), mask.expand(3, -1, -1, -1),
                                 need_weights=True)
    torch.testing.assert_close(shared, copied)
    assert shared[1].shape == (3, 1, 6) and bool((shared[1][..., 5] == 0).all())  # padding: no attention


def test_rnn_steps_give_the_teacher_forced_logits(trained_rnn):
    model = trained_rnn
    ids, mask = pad_sources(SOURCES[:2], 0)
    decoder_inputs = torch.tensor([[1, 5, 6, 7, 8, 9, 4], [1, 10, 11, 12, 2, 3, 3]])
    with torch.no_grad():
        full = model(ids, decoder_inputs, mask).logits
        decoding, _ = model.start_decoding(SOURCES[:2], 7, 2)
        steps = torch.stack([decoding.step(decoder_inputs[:, t: t + 1]) for t in range(7)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_rnn_greedy_is_the_argmax_of_the_teacher_forced_model(trained_rnn):
    model = trained_rnn
    out = greedy(model, SOURCES, 12)
    assert len({tuple(row) for row in out}) == len(SOURCES) and any(row[-1] == 2 for row in out)
    for source, row in zip(SOURCES, out):
        with torch.no_grad():
            logits = model(torch.tensor([source]), torch.tensor([[1] + row[:-1]])).logits[0]
        assert logits.argmax(-1).tolist() == row


def sequence_log_prob(model, source, tokens) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[1] + tokens[:-1]])).logits[0]
    return logits.double().log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).sum().item()


def assert_one_beam_is_greedy_and_n_best_lists_are_sorted_model_scores(model):
    for source in SOURCES:
        [best] = beam_search(model, source, 12, num_beams=1, alpha=0.0)
        assert best.tokens == greedy(model, [source], 12)[0]
        found = beam_search(model, source, 12, num_beams=4, alpha=0.6)
        assert len(found) == 4 and [h.score for h in found] == sorted((h.score for h in found), reverse=True)
        for h in found:
            assert h.log_prob == pytest.approx(sequence_log_prob(model, source, h.tokens), abs=1e-4)
            assert h.finished == (h.tokens[-1] == 2) and 2 not in h.tokens[:-1]


def test_transformer_beam_search(trained_transformer):
    assert_one_beam_is_greedy_and_n_best_lists_are_sorted_model_scores(trained_transformer)


def test_rnn_beam_search(trained_rnn):
    assert_one_beam_is_greedy_and_n_best_lists_are_sorted_model_scores(trained_rnn)


def test_early_stopping_stops_once_num_beams_have_finished(trained_transformer):
    model, stopped_early = trained_transformer, 0
    for source in SOURCES:
        patient = beam_search(model, source, 14, num_beams=3, alpha=0.0)
        with unittest.mock.patch.object(model, "next_token_logits", side_effect=model.next_token_logits) as steps:
            early = beam_search(model, source, 14, num_beams=3, alpha=0.0, early_stopping=True)
        finished = [h for h in early if h.finished]
        if len(finished) == 3:  # the step that finished the third one was the last
            assert steps.call_count == max(len(h.tokens) for h in finished)
            stopped_early += steps.call_count < 14
        assert early[0].score <= patient[0].score + 1e-6  # never better than the search that keeps going
    assert stopped_early


def test_sampling_from_an_encoder_decoder_is_reproducible_and_one_candidate_is_greedy(trained_transformer):
    model = trained_transformer
    a = sample(model, SOURCES, 10, generator=torch.Generator().manual_seed(3))
    assert a == sample(model, SOURCES, 10, generator=torch.Generator().manual_seed(3))
    assert sample(model, SOURCES, 10, top_k=1) == greedy(model, SOURCES, 10)


def test_decoding_runs_without_dropout_and_restores_the_mode():
    model = half_trained(transformer(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3), steps=5)
    expected = greedy(model, SOURCES, 6)
    model.train()
    assert greedy(model, SOURCES, 6) == expected and model.training


@pytest.mark.parametrize("call,message", [
    (lambda m: greedy(m, [], 5), "sources is empty"),
    (lambda m: greedy(m, [[]], 5), "a source is empty"),
    (lambda m: greedy(m, [5, 6], 5), "sources is a list of sources"),
    (lambda m: greedy(m, [[5] * 25], 5), "max_positions=24"),
    (lambda m: greedy(m, [[5]], 25), "max_positions=24"),
    (lambda m: greedy(m, [[5]], -1), "max_new_tokens must be >= 0"),
    (lambda m: beam_search(m, [5], 5, num_beams=0), "num_beams must be >= 1"),
])
def test_bad_requests_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as error:
        call(transformer())
    assert "\n" not in str(error.value)


def test_a_longer_sequence_than_the_positions_is_an_error():
    model = transformer()
    with pytest.raises(ValueError, match="longer than the model's max_positions=24"):
        model(torch.ones(1, 25, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


# -----------------------------------------------------------------------------
# models/kernels.py


@pytest.mark.parametrize("variant", list(TRANSFORMER_VARIANTS))
def test_the_transformer_is_the_same_with_the_kernels_on_and_off(variant):
    """Stacked projections in training, a decoding step's products through models/gemv.py: the outputs, every
    gradient and the decoded tokens of the model as models/seq2seq.py writes it."""
    fast, plain = on_and_off(EncoderDecoder, replace(TRANSFORMER, **TRANSFORMER_VARIANTS[variant]))
    assert type(fast.generator) is kernels.DecodingGenerator and type(plain.generator) is Generator
    assert type(fast.decoder.layers[0].encoder_attn) is kernels.FusedSeq2SeqAttention
    assert not any(type(m) in kernels.FAST_TWINS for m in fast.modules())
    assert not any(type(m) in kernels.FAST_TWINS.values() for m in plain.modules())
    assert fast.state_dict().keys() == plain.state_dict().keys()
    ids, mask = pad_sources(SOURCES, 0)
    _, decoder_inputs, targets = copy_batch(torch.Generator().manual_seed(0), len(SOURCES))
    assert_same(fast.train(), plain.train(), lambda m: m(ids, decoder_inputs, mask, targets=targets))
    assert greedy(fast, SOURCES, 10) == greedy(plain, SOURCES, 10)
    assert [h.tokens for h in beam_search(fast, SOURCES[0], 10)] == [h.tokens for h in beam_search(plain, SOURCES[0],
                                                                                                   10)]


def test_the_rnn_takes_the_cpu_dropout_and_nothing_else():
    fast, plain = kernels.use_fast_kernels(rnn(dropout=0.2)), rnn(dropout=0.2)
    assert {type(m) for m in fast.modules() if isinstance(m, torch.nn.Dropout)} == {kernels.CPUDropout}
    assert {type(m) for m in plain.modules() if isinstance(m, torch.nn.Dropout)} == {torch.nn.Dropout}
    assert fast.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(fast.state_dict())
    assert greedy(fast, SOURCES, 8) == greedy(plain, SOURCES, 8)


def test_a_decoding_step_multiplies_its_rows_by_models_gemv(monkeypatch):
    """Every product of a one-token step goes through models/gemv.py's kernel: per decoder layer q, k, v and the
    output of self-attention, q and the output of attention over the memory, the two of the feed-forward; then the
    Generator. The source's encoding and the memory's keys and values (more than gemv.MAX_ROWS rows) do not."""
    calls = count_gemv_calls(monkeypatch)
    model = kernels.use_fast_kernels(transformer()).eval()
    source = list(range(3, 13)) * 2  # 20 tokens: more rows than gemv.MAX_ROWS
    with torch.no_grad():
        decoding, first = model.start_decoding([source], 2, 1)
        assert calls == []
        decoding.step(first)
    assert len(calls) == 8 * model.config.decoder_layers + 1 and set(calls) == {(1, 32), (1, 64)}


# -----------------------------------------------------------------------------
# Checkpoints


@pytest.mark.parametrize("variant", ["seed 000", "BART"])
def test_save_and_load_pretrained_round_trip(tmp_path, variant):
    model = half_trained(transformer(**TRANSFORMER_VARIANTS[variant]), steps=3)
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    assert greedy(loaded, SOURCES, 8) == greedy(model, SOURCES, 8)
    with pytest.raises(ValueError, match="not a textrep-rnn-seq2seq checkpoint"):
        load_rnn(tmp_path)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_rnn_save_and_load_round_trip(tmp_path, attention):
    model = half_trained(rnn(attention=attention, cell="gru"), steps=3)
    save_rnn(model, tmp_path)
    loaded = load_rnn(tmp_path).eval()
    assert loaded.config == model.config
    assert greedy(loaded, SOURCES, 8) == greedy(model, SOURCES, 8)
