import json
import math

import numpy as np
import pytest
import torch

from models.bert import (
    BERT_SIZES,
    POSITION_EMBEDDING_TYPES,
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertSelfAttention,
    bert_config,
    load_pretrained,
    save_pretrained,
)

V = 101


def small_config(**overrides) -> BertConfig:
    base = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, max_relative_position=3)
    return BertConfig(**{**base, **overrides})


def batch(B=3, T=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, V, (B, T), generator=g)
    token_type_ids = (torch.arange(T) >= T // 2).long().expand(B, T)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, T - 4:] = 0  # one sequence already padded
    return input_ids, token_type_ids, attention_mask


ALL_VARIANTS = [(pe, pre) for pe in POSITION_EMBEDDING_TYPES for pre in (False, True)]


@pytest.mark.parametrize("position_embedding_type,pre_layer_norm", ALL_VARIANTS)
def test_shapes(position_embedding_type, pre_layer_norm):
    torch.manual_seed(0)
    config = small_config(position_embedding_type=position_embedding_type, pre_layer_norm=pre_layer_norm)
    input_ids, token_type_ids, attention_mask = batch()
    B, T = input_ids.shape
    model = BertModel(config).eval()
    seq, pooled = model(input_ids, token_type_ids, attention_mask)
    assert seq.shape == (B, T, 32) and pooled.shape == (B, 32)
    assert torch.isfinite(seq).all()

    seq2, pooled2, attentions = model(input_ids, token_type_ids, attention_mask, output_attentions=True)
    assert len(attentions) == 2 and all(a.shape == (B, 4, T, T) for a in attentions)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(B, 4, T))
    assert attentions[0][1, :, :, T - 4:].abs().max() == 0  # no probability mass on padding
    # The explicit-softmax path (used for attention maps) agrees with the SDPA path.
    torch.testing.assert_close(seq2, seq, atol=1e-5, rtol=1e-5)

    mlm, nsp = BertForPreTraining(config).eval()(input_ids, token_type_ids, attention_mask)
    assert mlm.shape == (B, T, V) and nsp.shape == (B, 2)
    assert BertForSequenceClassification(config, num_labels=3)(input_ids).shape == (B, 3)
    assert BertForSequenceClassification(config, num_labels=1)(input_ids).shape == (B, 1)
    assert BertForTokenClassification(config, num_labels=5)(input_ids).shape == (B, T, 5)
    start, end = BertForQuestionAnswering(config)(input_ids)
    assert start.shape == (B, T) and end.shape == (B, T)


def test_mean_pooling_classifier_reads_the_mean_of_the_real_token_states():
    torch.manual_seed(0)
    model = BertForSequenceClassification(small_config(), num_labels=2, pooling="mean").eval()
    input_ids, token_type_ids, attention_mask = batch()
    attention_mask[1, -4:] = 0
    with torch.no_grad():
        sequence, _ = model.bert(input_ids, token_type_ids, attention_mask)
        expected = torch.stack([sequence[0].mean(0), sequence[1, :-4].mean(0), sequence[2].mean(0)])
        torch.testing.assert_close(model(input_ids, token_type_ids, attention_mask), model.classifier(expected))
        # padding changes nothing: the padded row alone, cut to its real tokens, scores the same
        alone = model(input_ids[1:2, :-4], token_type_ids[1:2, :-4], attention_mask[1:2, :-4])
        torch.testing.assert_close(alone, model(input_ids, token_type_ids, attention_mask)[1:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pooling must be one of"):
        BertForSequenceClassification(small_config(), num_labels=2, pooling="max")


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_layer_norm_placement(pre_layer_norm):
    torch.manual_seed(0)
    model = BertModel(small_config(pre_layer_norm=pre_layer_norm)).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine and sublayer scales, so a misplaced LayerNorm shows
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    layer = model.encoder.layer[0]
    ln_a, ln_f = layer.attention.output.LayerNorm, layer.output.LayerNorm

    def attn(h):
        return layer.attention.output.dense(layer.attention.self(h)[0])

    def ffn(h):
        return layer.output.dense(torch.nn.functional.gelu(layer.intermediate.dense(h)))

    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        if pre_layer_norm:  # x + f(LN(x)) for both sublayers (Annotated Transformer)
            h = x + attn(ln_a(x))
            expected = h + ffn(ln_f(h))
        else:  # LN(x + f(x)) for both sublayers (Vaswani et al. 2017, BERT)
            h = ln_a(x + attn(x))
            expected = ln_f(h + ffn(h))
        torch.testing.assert_close(layer(x)[0], expected, atol=1e-5, rtol=1e-5)
    # Pre-LN needs one final LayerNorm on the residual stream; post-LN has none.
    assert ("encoder.LayerNorm.weight" in model.state_dict()) == pre_layer_norm


@pytest.mark.parametrize("position_embedding_type", POSITION_EMBEDDING_TYPES)
def test_padding_does_not_change_real_positions(position_embedding_type):
    torch.manual_seed(0)
    model = BertModel(small_config(position_embedding_type=position_embedding_type)).eval()
    input_ids, token_type_ids, attention_mask = batch()
    B, T = input_ids.shape
    seq, pooled = model(input_ids, token_type_ids, attention_mask)

    extra = 6  # random ids (not [PAD]) under a zero mask: only the mask may keep them out
    padded_ids = torch.cat([input_ids, torch.randint(1, V, (B, extra))], dim=1)
    padded_types = torch.cat([token_type_ids, torch.ones(B, extra, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([attention_mask, torch.zeros(B, extra, dtype=torch.long)], dim=1)
    seq_p, pooled_p = model(padded_ids, padded_types, padded_mask)

    real = attention_mask.bool()
    torch.testing.assert_close(seq_p[:, :T][real], seq[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled_p, pooled, atol=1e-5, rtol=1e-5)


def naive_relative_attention(attn: BertSelfAttention, x: torch.Tensor, mask: torch.Tensor):
    """Shaw et al. 2018 eqs. 2-5 written one (i, j) pair at a time. mask (B, T): 1 = token, 0 = pad."""
    B, T, H = x.shape
    nh, hs, k = attn.num_attention_heads, attn.attention_head_size, attn.max_relative_position
    q, kk, v = attn.query(x), attn.key(x), attn.value(x)  # (B, T, H)
    w_k, w_v = attn.relative_key.weight, attn.relative_value.weight  # (2k+1, hs)
    out = torch.zeros(B, T, H)
    probs = torch.zeros(B, nh, T, T)
    for b in range(B):
        for h in range(nh):
            sl = slice(h * hs, (h + 1) * hs)
            for i in range(T):
                e = torch.empty(T)
                for j in range(T):
                    a_k = w_k[max(-k, min(k, j - i)) + k]
                    e[j] = (q[b, i, sl] @ kk[b, j, sl] + q[b, i, sl] @ a_k) / math.sqrt(hs)
                    if mask[b, j] == 0:
                        e[j] = float("-inf")
                alpha = e.softmax(-1)
                probs[b, h, i] = alpha
                for j in range(T):
                    a_v = w_v[max(-k, min(k, j - i)) + k]
                    out[b, i, sl] += alpha[j] * (v[b, j, sl] + a_v)
    return out, probs


def test_relative_attention_matches_naive_loop():
    torch.manual_seed(0)
    config = small_config(position_embedding_type="relative", max_relative_position=2)
    attn = BertSelfAttention(config).eval()
    torch.nn.init.normal_(attn.relative_key.weight, std=1.0)  # large enough that a wrong a^K/a^V index shows
    torch.nn.init.normal_(attn.relative_value.weight, std=1.0)
    B, T = 2, 7  # T > k + 1, so distances get clipped
    x = torch.randn(B, T, 32)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min

    context, probs = attn(x, additive)
    expected, expected_probs = naive_relative_attention(attn, x, mask)
    torch.testing.assert_close(probs, expected_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(context, expected, atol=1e-5, rtol=1e-5)
    # the gathered / scattered relative tables get the naive loop's gradients
    weights = (attn.relative_key.weight, attn.relative_value.weight, attn.query.weight)
    probe = torch.randn_like(context)
    ours = torch.autograd.grad((context * probe).sum(), weights)
    naive = torch.autograd.grad((expected * probe).sum(), weights)
    for mine, reference in zip(ours, naive):
        assert mine.abs().sum() > 0
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-4)


def test_relative_positions_matter():
    # Without absolute positions, only the relative terms can make the output order-dependent.
    torch.manual_seed(0)
    model = BertModel(small_config(position_embedding_type="relative")).eval()
    ids = torch.randint(1, V, (1, 8))
    perm = torch.randperm(8)
    seq, _ = model(ids)
    seq_perm, _ = model(ids[:, perm])
    assert not torch.allclose(seq_perm, seq[:, perm], atol=1e-4)


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(small_config())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert sum(p is model.bert.embeddings.word_embeddings.weight for p in model.parameters()) == 1
    assert model.cls.predictions.bias.shape == (V,)
    # A gradient step through the MLM head moves the input embeddings.
    input_ids, token_type_ids, attention_mask = batch()
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()
    mlm, nsp = model(input_ids, token_type_ids, attention_mask)
    mlm.sum().backward()
    with torch.no_grad():
        model.cls.predictions.decoder.weight -= model.cls.predictions.decoder.weight.grad
    assert not torch.equal(model.bert.embeddings.word_embeddings.weight, before)


def test_heads_and_encoder_continue_a_pretraining_model_exactly():
    """What a later phase continues from: heads_state_dict (without the decoder, which is the word embedding matrix)
    and the encoder load back into a fresh model tensor for tensor, the decoder still tied; a missing head is an
    error."""
    torch.manual_seed(0)
    trained = BertForPreTraining(small_config())
    heads = trained.heads_state_dict()
    assert heads and all(k.startswith("cls.") for k in heads) and BertForPreTraining.TIED_DECODER not in heads
    torch.manual_seed(1)
    fresh = BertForPreTraining(small_config())
    fresh.load_encoder_and_heads(trained.bert, heads)
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    assert fresh.cls.predictions.decoder.weight is fresh.bert.embeddings.word_embeddings.weight
    with pytest.raises(RuntimeError, match="cls.seq_relationship.weight"):
        fresh.load_encoder_and_heads(trained.bert, {k: v for k, v in heads.items() if "seq_relationship" not in k})


def test_task_models_name_their_pretrained_encoder():
    config = small_config()
    for model in (BertForSequenceClassification(config, 3), BertForTokenClassification(config, 5),
                  BertForQuestionAnswering(config)):
        assert model.encoder is model.bert and isinstance(model.encoder, BertModel)


def test_mlm_positions_gather_equals_slicing_full_logits():
    torch.manual_seed(0)
    model = BertForPreTraining(small_config()).eval()
    input_ids, token_type_ids, attention_mask = batch()
    B, T = input_ids.shape
    positions = torch.tensor([[1, 4, 4, 9], [0, 2, 3, 5], [10, 8, 6, 7]])
    full, nsp_full = model(input_ids, token_type_ids, attention_mask)
    picked, nsp = model(input_ids, token_type_ids, attention_mask, mlm_positions=positions)
    assert picked.shape == (B, 4, V)
    torch.testing.assert_close(picked, full[torch.arange(B)[:, None], positions], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nsp, nsp_full)


def test_sinusoidal_table_matches_formula():
    config = small_config(position_embedding_type="sinusoidal", hidden_size=20, num_attention_heads=4)
    model = BertModel(config)
    table = model.embeddings.position_table
    d = config.hidden_size
    expected = torch.tensor([
        [math.sin(pos / 10000 ** (i / d)) if i % 2 == 0 else math.cos(pos / 10000 ** ((i - 1) / d)) for i in range(d)]
        for pos in range(config.max_position_embeddings)
    ])
    # scaled to the word embeddings' std (initializer_range): unscaled it drowns the words (see the next test)
    torch.testing.assert_close(table, expected.float() * config.initializer_range * math.sqrt(2), atol=1e-6, rtol=0)
    # Fixed, not learned: neither a parameter nor saved in checkpoints.
    assert not any("position" in name for name, _ in model.named_parameters())
    assert not any("position" in name for name in model.state_dict())


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal", "relative"])
def test_every_position_scheme_lets_masked_lm_learn_from_the_neighbours(position_embedding_type):
    """A model that cannot tell positions apart (the unscaled sinusoidal table did this) stays at the unigram loss on
    a task only neighbours solve; each scheme must get well below it in a few hundred steps."""
    from pipeline.bert.data import BertPretrainingCollator
    from pipeline.bert.module import bert_pretraining_losses
    from pipeline.engine.optim import adamw_with_schedule
    from tests.helpers import successor_corpus

    vocab, rng = 45, np.random.default_rng(0)
    collator = BertPretrainingCollator(pad_id=0, mask_id=4, vocab_size=vocab, special_ids=range(5),
                                       generator=torch.Generator().manual_seed(0))
    train, held_out = successor_corpus(rng, 2000, vocab), collator(successor_corpus(rng, 64, vocab))
    torch.manual_seed(0)
    model = BertForPreTraining(small_config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, max_position_embeddings=16, pre_layer_norm=True,
                                            position_embedding_type=position_embedding_type,
                                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    steps = 300
    optimization = adamw_with_schedule(model, 3e-3, 0.0, (0.9, 0.999), 10, steps)
    for _ in range(steps):
        batch = collator([train[int(i)] for i in rng.integers(0, len(train), 32)])
        optimization["optimizer"].zero_grad()
        bert_pretraining_losses(model, batch)["mlm_loss"].backward()
        optimization["optimizer"].step()
        optimization["lr_scheduler"]["scheduler"].step()
    with torch.no_grad():
        held_out_loss = float(bert_pretraining_losses(model.eval(), held_out)["mlm_loss"])
    assert held_out_loss < math.log(vocab - 5) - 1.0  # the unigram loss of this corpus is log 40


@pytest.mark.parametrize("position_embedding_type,pre_layer_norm",
                         [("learned", False), ("sinusoidal", True), ("relative", True)])
def test_save_load_pretrained_round_trip(tmp_path, position_embedding_type, pre_layer_norm):
    torch.manual_seed(0)
    config = small_config(position_embedding_type=position_embedding_type, pre_layer_norm=pre_layer_norm)
    model = BertModel(config).eval()
    save_pretrained(model, tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["format"] == "textrep-bert" and (tmp_path / "ckpt" / "model.safetensors").exists()

    loaded = load_pretrained(tmp_path / "ckpt").eval()
    assert loaded.config == config
    input_ids, token_type_ids, attention_mask = batch()
    inputs = (input_ids, token_type_ids, attention_mask)
    for a, b in zip(model(*inputs), loaded(*inputs)):
        assert torch.equal(a, b)


def test_load_pretrained_rejects_unknown_format(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError):
        load_pretrained(tmp_path)


def test_config_dict_round_trip_ignores_unknown_keys():
    config = small_config(position_embedding_type="relative", pre_layer_norm=True)
    assert BertConfig.from_dict({**config.to_dict(), "format": "textrep-bert", "something_new": 1}) == config
    with pytest.raises(ValueError):
        BertConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError):
        BertConfig(position_embedding_type="rotary")


@pytest.mark.parametrize("name,L,H,A,I", [
    ("bert_tiny", 2, 128, 2, 512), ("bert_mini", 4, 256, 4, 1024), ("bert_small", 4, 512, 8, 2048),
    ("bert_medium", 8, 512, 8, 2048), ("bert_base", 12, 768, 12, 3072),
])
def test_named_sizes(name, L, H, A, I):
    c = bert_config(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (L, H, A, I)
    assert set(BERT_SIZES) == {"bert_tiny", "bert_mini", "bert_small", "bert_medium", "bert_base"}


def test_bert_base_has_110m_parameters():
    with torch.device("meta"):  # count without allocating or initialising 110M floats
        model = BertModel(bert_config("bert_base"))
    assert model.config.vocab_size == 30522
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - 110e6) / 110e6 < 0.02, n


def test_bert_config_overrides():
    c = bert_config("bert_tiny", vocab_size=8000, position_embedding_type="relative")
    assert c.vocab_size == 8000 and c.position_embedding_type == "relative" and c.hidden_size == 128
    with pytest.raises(KeyError):
        bert_config("bert_huge")


def test_init_like_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config("bert_tiny", vocab_size=2000))
    dense = model.bert.encoder.layer[0].intermediate.dense
    assert abs(dense.weight.std().item() - 0.02) < 0.002 and dense.bias.abs().max() == 0
    ln = model.bert.encoder.layer[0].output.LayerNorm
    assert torch.equal(ln.weight, torch.ones_like(ln.weight)) and ln.bias.abs().max() == 0
    assert abs(model.bert.embeddings.word_embeddings.weight.std().item() - 0.02) < 0.002
    assert model.cls.predictions.bias.abs().max() == 0
