"""The copy mechanism of both encoder-decoders (`copy_attention`, models.seq2seq.PointerGenerator, See et al. 2017):
the mixture is a distribution, with p_gen at 0 it is the attention scattered onto the source's ids (padding never
copied), the loss is its NLL, a task that copying learns within a budget the vocabulary alone does not, and its
HuggingFace export (our modelling code, BART having no such mechanism) scoring and beam-searching as ours. Cached
decoding, greedy and beam search on the mixture: tests/seq2seq/test_seq2seq.py's copy-attention variants; through the
pipeline: tests/seq2seq/test_copy_attention_pipeline.py; the export of a pipeline run, loaded in a fresh process:
tests/seq2seq/test_seq2seq_export.py."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from models import IGNORE_INDEX
from models.generation import beam_search, greedy
from models.hf.seq2seq import hf_architecture, hf_incompatibility, to_hf
from models.rnn_seq2seq import RNNEncoderDecoder, rnn_seq2seq_config
from models.seq2seq import EncoderDecoder, bart_config, pad_sources, seq2seq_config, shift_right
from tests.seq2seq.test_seq2seq import RNN, SOURCES, TRANSFORMER, V

PAD, START, EOS = 0, 1, 2
COPYING_RNN = replace(RNN, copy_attention=True, attention="dot")  # dot: attention that reference_attention recomputes
MODELS = {
    "transformer": lambda: EncoderDecoder(replace(TRANSFORMER, copy_attention=True)),
    "rnn": lambda: RNNEncoderDecoder(COPYING_RNN),
    "rnn without input feeding": lambda: RNNEncoderDecoder(replace(COPYING_RNN, input_feeding=False)),
}


def padded_batch():
    """SOURCES right-padded (one with repeated tokens) and a decoder input per source."""
    ids, mask = pad_sources(SOURCES, PAD)
    targets = torch.tensor([[5, 6, 7, 2], [12, 11, 10, 2], [3, 2, IGNORE_INDEX, IGNORE_INDEX], [4, 5, 6, 7]])
    return ids, mask, targets, shift_right(targets, START, PAD)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_mixture_is_a_distribution_and_the_eval_loss_its_nll(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    with torch.no_grad():
        model.pointer.p_gen.bias.fill_(0.5)  # a gate away from its initial 1/2 on both sides of the batch
    ids, mask, targets, decoder_inputs = padded_batch()
    with torch.no_grad():
        out = model(ids, decoder_inputs, mask, targets)
    torch.testing.assert_close(out.logits.exp().sum(-1), torch.ones(4, 4), atol=1e-5, rtol=0)
    scored = targets != IGNORE_INDEX
    nll = -out.logits.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[scored].mean()
    assert out.loss.item() == pytest.approx(nll.item(), rel=1e-5)


def reference_attention(model, ids, mask, decoder_inputs) -> torch.Tensor:
    """The decoder's attention probabilities over the source (B, T, S) recomputed from outside the model: for the
    Transformer, softmax(q k^T / sqrt(hs)) of its last layer averaged over heads, from the queries its q_proj produced;
    for the RNN (dot attention), softmax(h_t . h_s) from the outputs its RNN produced."""
    seen = []
    if isinstance(model, EncoderDecoder):
        attention = model.decoder.layers[-1].encoder_attn
        hook = attention.q_proj.register_forward_hook(lambda m, args, out: seen.append(out))
        with torch.no_grad():
            model(ids, decoder_inputs, mask)
            k = attention.k_proj(model.encoder_states(ids, mask))
        hook.remove()
        [q] = seen
        B, T, d = q.shape
        heads = lambda x: x.view(B, x.size(1), attention.n_head, -1).transpose(1, 2)  # noqa: E731
        scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(d // attention.n_head)
        return scores.masked_fill(~mask.bool()[:, None, None], float("-inf")).softmax(-1).mean(1)
    hook = model.decoder.rnn.register_forward_hook(lambda m, args, out: seen.append(out[0]))
    with torch.no_grad():
        model(ids, decoder_inputs, mask)
        states = model.encoder_states(ids, mask)
    hook.remove()
    h = torch.cat(seen, 1)  # (B, T, H): one call, or one per step with input feeding
    return (h @ states.transpose(1, 2)).masked_fill(~mask.bool()[:, None], float("-inf")).softmax(-1)


@pytest.mark.parametrize("name", list(MODELS))
def test_with_p_gen_at_zero_the_output_is_the_attention_scattered_onto_the_source_ids(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    with torch.no_grad():
        model.pointer.p_gen.weight.zero_()
        model.pointer.p_gen.bias.fill_(-1e4)  # log p_gen = -1e4, log (1 - p_gen) = 0: nothing generated
    ids, mask, _, decoder_inputs = padded_batch()
    with torch.no_grad():
        probs = model(ids, decoder_inputs, mask).logits.exp()
    attention = reference_attention(model, ids, mask, decoder_inputs)  # (B, T, S)
    copied = attention @ F.one_hot(ids, V).float()  # (B, T, V): a repeated source token gets each of its shares
    torch.testing.assert_close(probs, copied, atol=1e-6, rtol=1e-5)
    assert probs[1:, :, PAD].max() < 1e-30  # the padded sources' padding (id 0, in no source) is never copied


# -----------------------------------------------------------------------------
# A task that copying learns: reversing 6 symbols of ~500, where the vocabulary distribution alone has to learn an
# identity map over every symbol and the pointer has only to attend to the right position

SYMBOLS, LENGTH, BATCH = 500, 6, 32
BUDGETS = {  # (steps, Adam's rate): each the model's own, seeded
    "transformer": (150, 1e-3),
    "rnn": (100, 3e-3),
}


def reverse_batch(generator: torch.Generator, n: int):
    source = torch.randint(EOS + 1, SYMBOLS, (n, LENGTH), generator=generator)
    targets = torch.cat([source.flip(1), torch.full((n, 1), EOS)], dim=1)
    return source, shift_right(targets, START, PAD), targets


def exact_match_after_training(name: str, copy_attention: bool) -> float:
    torch.manual_seed(0)
    ids = dict(vocab_size=SYMBOLS, pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS, dropout=0.0,
               copy_attention=copy_attention)
    model = (EncoderDecoder(seq2seq_config("seq2seq_tiny", d_model=64, d_ff=128, max_positions=16,
                                           label_smoothing=0.0, **ids)) if name == "transformer"
             else RNNEncoderDecoder(rnn_seq2seq_config("rnn_attn_tiny", embedding_dim=32, hidden_size=64, **ids)))
    steps, lr = BUDGETS[name]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        source, decoder_inputs, targets = reverse_batch(generator, BATCH)
        model(source, decoder_inputs, targets=targets).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    source, _, targets = reverse_batch(torch.Generator().manual_seed(12345), 200)
    written = greedy(model, source.tolist(), LENGTH + 1)
    return sum(row == target for row, target in zip(written, targets.tolist())) / len(written)


@pytest.mark.parametrize("name", list(BUDGETS))
def test_copy_attention_learns_to_reverse_where_the_vocabulary_alone_does_not_yet(name):
    plain, copying = exact_match_after_training(name, False), exact_match_after_training(name, True)
    print(f"\nreversal, {name}, {BUDGETS[name][0]} steps of {BATCH}: exact match {plain:.1%} without copy attention, "
          f"{copying:.1%} with")
    assert copying >= 0.5 and copying - plain >= 0.4


EXPORTED = {  # the Transformer BART-shaped, so that only copying keeps it from BART
    "transformer": lambda: EncoderDecoder(bart_config("seq2seq_tiny", vocab_size=V, d_model=32, n_head=4, d_ff=64,
                                                      max_positions=16, copy_attention=True)),
    "rnn": MODELS["rnn"],
}


@pytest.mark.parametrize("name", list(EXPORTED))
def test_the_hf_export_computes_the_mixture_and_beam_searches_as_ours(tmp_path, name):
    """BART cannot copy, so to_hf writes our layout with the gate's weights, and our modelling code built from it
    gives our mixture on a padded batch with repeated source tokens and finds our beam search's n-best with its
    scores: the source's ids reach the copy term of every beam (generate repeats the encoder's outputs, which keep
    them, per beam)."""
    pytest.importorskip("transformers")
    from models.hf import modeling_textrep_rnn_seq2seq, modeling_textrep_seq2seq  # they need transformers

    torch.manual_seed(0)
    model = EXPORTED[name]().eval()
    with torch.no_grad():
        model.pointer.p_gen.bias.fill_(-0.5)  # both terms weigh: p_gen about 0.4
    if name == "transformer":
        assert "copy_attention=True" in hf_incompatibility(model.config)
    architecture = to_hf(model, tmp_path)
    assert architecture == hf_architecture(model) != "BartForConditionalGeneration"
    assert {"pointer.p_gen.weight", "pointer.p_gen.bias"} <= set(load_file(tmp_path / "model.safetensors"))
    code = modeling_textrep_seq2seq if name == "transformer" else modeling_textrep_rnn_seq2seq
    hf = getattr(code, architecture).from_pretrained(tmp_path).eval()
    assert hf.config.copy_attention
    ids, mask, _, decoder_inputs = padded_batch()  # SOURCES has a source of repeated tokens, and padding
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_inputs).logits,
                                   model(ids, decoder_inputs, mask).logits, atol=1e-5, rtol=0)
        out = hf.generate(input_ids=ids, attention_mask=mask, num_beams=3, num_return_sequences=3, max_new_tokens=6,
                          length_penalty=0.0, do_sample=False, output_scores=True, return_dict_in_generate=True)
    for row, source in enumerate(SOURCES):
        found = beam_search(model, source, 6, num_beams=3, alpha=0.0)  # alpha = 0 ranks as length_penalty=0.0
        sequences = out.sequences[3 * row: 3 * row + 3, 1:].tolist()  # less the start token
        assert [h.tokens for h in found] == [s[:s.index(EOS) + 1] if EOS in s else s for s in sequences]
        assert [h.score for h in found] == pytest.approx(out.sequences_scores[3 * row: 3 * row + 3].tolist(),
                                                         abs=1e-4)
