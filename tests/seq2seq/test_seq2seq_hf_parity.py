"""Numerical parity of models/seq2seq.py with HuggingFace transformers' BartForConditionalGeneration, both ways, on
random weights: logits to 1e-5, and beam search with 4 beams (models/generation.py) against HF's `generate`. The
largest differences are printed: `pytest -s tests/seq2seq/test_seq2seq_hf_parity.py`."""
import dataclasses
import itertools

import pytest
import torch

transformers = pytest.importorskip("transformers")

from models.generation import beam_search, greedy  # noqa: E402
from models.hf.seq2seq import config_from_hf, from_hf, hf_incompatibility, to_bart, to_hf  # noqa: E402
from models.seq2seq import EncoderDecoder, bart_config, pad_sources  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
SMALL = dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40)
SOURCES = [[5, 17, 3, 42, 8, 60, 11], [7, 7, 30, 2], [90, 14, 21, 33, 4, 5, 6, 7, 8]]


def randomise_(model, scale=0.1):
    # fresh inits leave LayerNorms the identity and biases zero: random values show a swapped or dropped tensor
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(std=scale)
    return model


def hf_model(**overrides):
    config = transformers.BartConfig(**{**SMALL, **overrides}, forced_eos_token_id=None, attn_implementation="eager")
    return randomise_(transformers.BartForConditionalGeneration(config)).eval()


def inputs():
    ids, mask = pad_sources(SOURCES, pad_token_id=1)
    decoder_ids = torch.randint(3, 99, (3, 11), generator=torch.Generator().manual_seed(0))
    decoder_ids[:, 0] = 2  # BART's decoder_start_token_id
    return ids, mask, decoder_ids


def max_logit_diff(ours: EncoderDecoder, hf) -> float:
    ours.eval()
    ids, mask, decoder_ids = inputs()
    with torch.no_grad():
        a = ours(ids, decoder_ids, mask).logits
        b = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(a, b, **TOL)
    return (a - b).abs().max().item()


@pytest.mark.parametrize("overrides", [{}, dict(scale_embedding=True, activation_function="relu")],
                         ids=["bart", "scaled-relu"])
def test_hf_to_ours(tmp_path, overrides):
    torch.manual_seed(0)
    hf = hf_model(**overrides)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert (ours.config.decoder_layers, ours.config.pad_token_id, ours.config.decoder_start_token_id) == (3, 1, 2)
    print(f"\nBART -> ours ({overrides or 'defaults'}): max |logit difference| {max_logit_diff(ours, hf):.2e}")
    config = config_from_hf(hf.config.to_dict())
    assert max_logit_diff(from_hf(hf.state_dict(), config), hf) <= 1e-5
    bare = from_hf(hf.model.state_dict(), config)  # BartModel's: no final_logits_bias, so ours has a zero bias
    assert not bare.generator.bias.any()
    with torch.no_grad():
        bare.generator.bias.copy_(hf.final_logits_bias[0])
    assert max_logit_diff(bare, hf) <= 1e-5
    with pytest.raises(ValueError, match="needs config"):
        from_hf(hf.state_dict())


def ours_bart(**overrides) -> EncoderDecoder:
    torch.manual_seed(0)
    # Non-default values wherever BART has a default, so that a field missing from the exported config.json shows
    config = bart_config("seq2seq_tiny", vocab_size=99, d_model=32, n_head=4, d_ff=64, decoder_layers=3,
                         max_positions=40, dropout=0.2, attention_dropout=0.05, activation_dropout=0.15,
                         pad_token_id=1, decoder_start_token_id=2, eos_token_id=2, **overrides)
    return randomise_(EncoderDecoder(config)).eval()


def test_ours_to_hf(tmp_path):
    ours = ours_bart(scale_embedding=True)
    to_hf(ours, tmp_path)
    hf, info = transformers.BartForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager",
                                                                         output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched: the tied copies tie on load
    assert hf.lm_head.weight.data_ptr() == hf.model.shared.weight.data_ptr()
    assert (hf.config.dropout, hf.config.activation_dropout, hf.config.scale_embedding) == (0.2, 0.15, True)
    print(f"\nours -> BART: max |logit difference| {max_logit_diff(ours, hf.eval()):.2e}")
    assert from_hf(tmp_path).config == dataclasses.replace(ours.config, label_smoothing=0.0)  # BART has no such field


def test_beam_search_gives_hf_generates_tokens_and_scores(tmp_path):
    """Beam 4 with no length penalty (alpha = 0 here, length_penalty=0.0 there): the same n-best list, sequences and
    scores. HF normalises by |Y|^length_penalty and ours by GNMT's ((5 + |Y|) / 6)^alpha, so only alpha = 0 ranks
    alike; both stop when no live beam can beat the worst finished one (HF's default early_stopping=False is that
    bound when length_penalty is 0)."""
    ours = ours_bart()
    to_hf(ours, tmp_path)
    hf = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    ended = blocked = 0
    for source, ngram in itertools.product(SOURCES, (0, 2)):  # and with HF's no_repeat_ngram_size=2
        ids = torch.tensor([source])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=4, num_return_sequences=4,
                          max_new_tokens=12, length_penalty=0.0, do_sample=False, output_scores=True,
                          return_dict_in_generate=True, no_repeat_ngram_size=ngram)
        expected = [[t for t in row[1:] if t != 1] for row in out.sequences.tolist()]  # less the start and padding
        found = beam_search(ours, source, 12, num_beams=4, alpha=0.0, no_repeat_ngram_size=ngram)
        assert [h.tokens for h in found] == expected
        assert [h.score for h in found] == pytest.approx(out.sequences_scores.tolist(), abs=1e-4)
        ended += sum(h.finished for h in found)
        blocked += ngram and found != beam_search(ours, source, 12, num_beams=4, alpha=0.0)
        if ngram:
            continue
        greedy_hf = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=1, max_new_tokens=12,
                                do_sample=False)
        assert greedy(ours, [source], 12)[0] == [t for t in greedy_hf[0, 1:].tolist() if t != 1]
    assert ended  # the end token was produced: HF's and our bookkeeping of finished beams compared too
    assert blocked  # n-gram blocking changed some search: the blocked n-grams were compared too


def test_a_config_that_forces_tokens_in_hf_generate_loads_with_a_warning(tmp_path):
    config = transformers.BartConfig(**SMALL)  # BartConfig's default forced_eos_token_id=2
    transformers.BartForConditionalGeneration(config).save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="forced_eos_token_id.*forces none"):
        from_hf(tmp_path)


def test_what_bart_cannot_compute_is_not_written_as_bart(tmp_path):
    model = EncoderDecoder(bart_config("seq2seq_tiny", vocab_size=99, pre_layer_norm=True))
    assert "pre_layer_norm=True" in hf_incompatibility(model.config)
    with pytest.raises(ValueError, match="pre_layer_norm=True.*bart_config"):
        to_bart(model, tmp_path / "bart")
    assert hf_incompatibility(bart_config("seq2seq_tiny")) == ""
    # to_hf writes it with our modelling code instead (tests/seq2seq/test_seq2seq_export.py loads it)
    assert to_hf(model, tmp_path / "ours") == "TextrepSeq2SeqForConditionalGeneration"
    assert (tmp_path / "ours" / "modeling_textrep_seq2seq.py").is_file()


@pytest.mark.parametrize("field,value", [("decoder_attention_heads", 2), ("activation_function", "silu"),
                                         ("tie_word_embeddings", False)])
def test_configs_our_model_does_not_compute_are_rejected(field, value):
    hf = transformers.BartConfig(**{**SMALL, field: value}).to_dict()
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        config_from_hf(hf)
