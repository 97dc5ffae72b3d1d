"""models/kernels.py: use_fast_kernels(model), applied from outside to a built model, swaps in faster modules that
compute what the plain models compute. A model is built plain; with the kernels applied it gives the same outputs and
the same gradients (to float rounding) from the same weights; each kernel's own contract is tested below. The pipeline
applies them where trainer.fast_kernels is on (the default), and an old config.json that still says fast_kernels
loads."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from models import IGNORE_INDEX, gemv, kernels
from models.bert import (
    POSITION_EMBEDDING_TYPES,
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from models.checkpoint import random_twin
from models.electra import ElectraForPreTraining
from models.gpt import GPTConfig, GPTForSequenceClassification, GPTForTokenClassification, GPTLMHeadModel
from models.kernels import CPUDropout, DecodingLinear, RealTokens, use_fast_kernels

V = 101
BERT = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, max_relative_position=3, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
GPT = GPTConfig(vocab_size=V, n_positions=24, n_embd=32, n_layer=2, n_head=4, embd_pdrop=0.0, attn_pdrop=0.0,
                resid_pdrop=0.0)


def bert_batch(B=3, T=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, V, (B, T), generator=g)
    token_type_ids = (torch.arange(T) >= T // 2).long().expand(B, T)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, T - 4:] = 0
    attention_mask[2, 3:] = 0
    return input_ids, token_type_ids, attention_mask


def on_and_off(build, config):
    """The model `build(config)` makes, with the kernels on and off, holding the same weights (perturbed from the init,
    so that no LayerNorm is the identity and no bias zero)."""
    torch.manual_seed(0)
    fast = use_fast_kernels(build(config))
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.1 * torch.randn_like(p))
    plain = build(config)
    plain.load_state_dict(fast.state_dict())
    return fast, plain


def outputs_and_gradients(model, run):
    """The tensors `run(model)` returns and every parameter's gradient of a random projection of them."""
    model.zero_grad()
    out = [t.float() for t in run(model) if t is not None and t.is_floating_point()]
    torch.manual_seed(1)
    sum((t * torch.randn_like(t)).sum() for t in out).backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def assert_same(fast, plain, run, **tolerance):
    tolerance = tolerance or dict(atol=1e-5, rtol=1e-4)
    fast_out, fast_grads = outputs_and_gradients(fast, run)
    plain_out, plain_grads = outputs_and_gradients(plain, run)
    assert len(fast_out) == len(plain_out) and fast_out
    for a, b in zip(fast_out, plain_out):
        torch.testing.assert_close(a, b, **tolerance)
    assert fast_grads.keys() == plain_grads.keys() and fast_grads
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], plain_grads[name], **tolerance, msg=name)


def bert_encoder_run(model):
    """The states and the probabilities of the real queries: a padded query's are not defined (the packed layers give it
    no state)."""
    input_ids, token_type_ids, attention_mask = bert_batch()
    seq, pooled, probs = model(input_ids, token_type_ids, attention_mask, output_attentions=True)
    return seq, pooled, *(p * attention_mask[:, None, :, None] for p in probs)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
@pytest.mark.parametrize("position_embedding_type", POSITION_EMBEDDING_TYPES)
@pytest.mark.parametrize("output_attentions", [False, True])
def test_bert_encoder_is_the_same_with_the_kernels_on_and_off(position_embedding_type, pre_layer_norm,
                                                              output_attentions):
    """Packed layers, fused q/k/v and SDPA or the explicit softmax: outputs (zero at the padding either way), attention
    probabilities and every gradient as the model written in models/bert.py."""
    config = replace(BERT, position_embedding_type=position_embedding_type, pre_layer_norm=pre_layer_norm)
    fast, plain = on_and_off(BertModel, config)
    assert type(fast.encoder) is kernels.PackedBertEncoder and type(plain.encoder) is not kernels.PackedBertEncoder
    run = bert_encoder_run if output_attentions else (lambda m: m(*bert_batch()))
    assert_same(fast.train(), plain.train(), run)
    assert_same(fast.eval(), plain.eval(), run)
    seq, _ = plain(*bert_batch())
    assert torch.all(seq[~bert_batch()[2].bool()] == 0)


def test_bert_under_cpu_autocast_is_the_same_with_the_kernels_on_and_off():
    """bf16 autocast, where the packed rows and the length are rounded up (PACKED_ROW_MULTIPLE)."""
    fast, plain = on_and_off(BertForPreTraining, replace(BERT, position_embedding_type="relative"))
    positions = torch.tensor([[1, 4, 5, 9], [0, 2, 3, 5], [0, 1, 2, 2]])

    def run(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(*bert_batch(), mlm_positions=positions)

    assert_same(fast, plain, run, atol=3e-2, rtol=5e-2)


@pytest.mark.parametrize("build", [
    lambda c: BertForPreTraining(c),
    lambda c: ElectraForPreTraining(c, generator_layers=1),
    lambda c: BertForSequenceClassification(c, 3, pooling="mean"),
    lambda c: BertForSequenceClassification(c, 1),
    lambda c: BertForTokenClassification(c, 5),
    lambda c: BertForQuestionAnswering(c),
], ids=["pretraining", "electra", "mean-pooled classifier", "regressor", "tagger", "qa"])
def test_bert_task_models_are_the_same_with_the_kernels_on_and_off(build):
    """Every model over the encoder, the MLM decoder's gradient of the tied word embeddings included (ELECTRA's
    generator samples from the global RNG: the same seed, the same samples)."""
    fast, plain = on_and_off(build, BERT)
    input_ids, token_type_ids, attention_mask = bert_batch()
    if isinstance(fast, ElectraForPreTraining):
        positions, labels = torch.tensor([[1, 2, 3]] * 3), torch.tensor([[7, 8, 9], [10, 11, 0], [12, 0, 0]])
        labels[labels == 0] = IGNORE_INDEX

        def run(model):
            torch.manual_seed(2)
            return model(input_ids, token_type_ids, attention_mask, positions, labels)[:2]
    else:
        def run(model):
            out = model(input_ids, token_type_ids, attention_mask)
            return out if isinstance(out, tuple) else (out,)
    assert_same(fast.train(), plain.train(), run)


@pytest.mark.parametrize("build", [
    lambda c: GPTLMHeadModel(c),
    lambda c: GPTForSequenceClassification(c, 2),
    lambda c: GPTForTokenClassification(c, 4),
], ids=["lm", "classifier", "tagger"])
def test_gpt_is_the_same_with_the_kernels_on_and_off(build):
    fast, plain = on_and_off(build, GPT)
    idx = torch.randint(0, V, (2, 2, 9), generator=torch.Generator().manual_seed(0))
    if isinstance(fast, GPTLMHeadModel):
        def run(model):
            return model(idx[:, 0], targets=idx[:, 1])
    elif isinstance(fast, GPTForSequenceClassification):
        def run(model):
            return model(idx, torch.tensor([[8, 5], [3, 8]]))
    else:
        def run(model):
            return (model(idx[:, 0]),)
    assert_same(fast.train(), plain.train(), run)


def test_gpt_decoding_steps_are_the_same_with_the_kernels_on_and_off():
    fast, plain = (model.eval() for model in on_and_off(GPTLMHeadModel, GPT))
    assert type(fast) is kernels.DecodingGPTLMHeadModel and type(plain) is GPTLMHeadModel
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        steps = []
        for model in (fast, plain):
            cache = model.new_cache(2, 7)
            first = model.next_token_logits(prompt, cache)
            steps.append(torch.cat([first, model.next_token_logits(first.argmax(-1, keepdim=True), cache)]))
    torch.testing.assert_close(steps[0], steps[1], atol=1e-5, rtol=1e-5)


MODELS = {
    "BertModel": lambda c: BertModel(c),
    "BertForPreTraining": lambda c: BertForPreTraining(c),
    "ElectraForPreTraining": lambda c: ElectraForPreTraining(c, generator_layers=1),
    "BertForSequenceClassification": lambda c: BertForSequenceClassification(c, 2),
    "BertForTokenClassification": lambda c: BertForTokenClassification(c, 2),
    "BertForQuestionAnswering": lambda c: BertForQuestionAnswering(c),
    "GPTLMHeadModel": lambda c: GPTLMHeadModel(c),
    "GPTForSequenceClassification": lambda c: GPTForSequenceClassification(c, 2),
    "GPTForTokenClassification": lambda c: GPTForTokenClassification(c, 2),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_is_built_plain_and_made_fast_from_outside(name):
    """Built, no module has a fast twin's class; after use_fast_kernels every module with a fast twin has become it
    (a BERT task model's head too: the training path is the fast one). State-dict keys are the same either way."""
    config = BERT if name.startswith(("Bert", "Electra")) else GPT
    plain = MODELS[name](config)
    fast = use_fast_kernels(MODELS[name](config))
    fast_classes = set(kernels.FAST_TWINS.values()) | {DecodingLinear, kernels.TiedWordEmbedding, kernels.TiedDecoder}
    assert not any(type(m) in kernels.FAST_TWINS for m in fast.modules())
    assert not any(type(m) in fast_classes for m in plain.modules())
    if any(isinstance(m, torch.nn.Dropout) for m in fast.modules()):
        assert all(type(m) is CPUDropout for m in fast.modules() if isinstance(m, torch.nn.Dropout))
    if name in ("BertForPreTraining", "ElectraForPreTraining"):
        assert sum(type(m) in (kernels.TiedWordEmbedding, kernels.TiedDecoder) for m in fast.modules()) == 2
    assert fast.state_dict().keys() == plain.state_dict().keys()
    if name in ("BertModel", "GPTLMHeadModel"):  # the random-init baseline: the same class and config again
        twin = use_fast_kernels(random_twin(fast, seed=0))  # as the evaluate stage's encoders build it
        assert [type(m) for m in twin.modules()] == [type(m) for m in fast.modules()]


def test_what_holds_a_model_keeps_its_own_modules():
    """use_fast_kernels reaches the BERT, GPT and encoder-decoder models inside what it is given (a LightningModule, a
    task model), and nothing else: the holder's own modules and ELMo's or Skip-Thought's keep their classes."""
    holder = torch.nn.ModuleDict({"bert": BertForPreTraining(replace(BERT, hidden_dropout_prob=0.1)),
                                  "other": torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(4, 4))})
    assert use_fast_kernels(holder) is holder
    assert type(holder["bert"].bert.encoder) is kernels.PackedBertEncoder
    assert [type(m) for m in holder["other"]] == [torch.nn.Dropout, torch.nn.Linear]


# -----------------------------------------------------------------------------
# Each kernel's own contract


def test_packed_layers_see_only_the_real_tokens():
    model = use_fast_kernels(BertModel(BERT))
    rows_seen = []
    model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, inputs, out: rows_seen.append(inputs[0]))
    input_ids, token_type_ids, attention_mask = bert_batch()
    model(input_ids, token_type_ids, attention_mask)
    model(input_ids, token_type_ids)
    assert rows_seen[0].shape == (int(attention_mask.sum()), BERT.hidden_size)  # no row for a padded position
    assert rows_seen[1].shape == (*input_ids.shape, BERT.hidden_size)


@pytest.mark.parametrize("position_embedding_type", ["learned", "relative"])
def test_under_autocast_the_layers_see_few_shapes_and_the_outputs_are_unchanged(monkeypatch, position_embedding_type):
    """Under bf16 autocast oneDNN builds a kernel per shape: packed rows come in multiples of PACKED_ROW_MULTIPLE and
    batches are padded to a multiple of PADDED_LENGTH_MULTIPLE positions, the extra rows' results dropped. Outputs,
    attention probabilities and gradients are those of the exact shapes."""
    torch.manual_seed(0)
    model = use_fast_kernels(BertModel(replace(BERT, position_embedding_type=position_embedding_type)))
    input_ids, token_type_ids, attention_mask = bert_batch(B=3, T=11)
    attention_mask[2, 5:] = 0
    real = attention_mask.bool()
    shapes = []
    model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, o: shapes.append(i[0].shape))
    model.encoder.layer[0].attention.self.register_forward_hook(lambda m, i, o: shapes.append(o[1].shape))

    def run():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seq, pooled, probs = model(input_ids, token_type_ids, attention_mask, output_attentions=True)
        (seq.float()[real].sum() + pooled.float().sum()).backward()
        return seq.float(), [p.float() for p in probs], {n: p.grad.clone() for n, p in model.named_parameters()}

    seq, probs, grads = run()
    assert shapes == [(3, 4, 16, 16), (48, 32)]  # 22 real tokens -> 64 rows, capped at the 3 x 16 positions
    assert seq.shape == (3, 11, 32) and torch.all(seq[~real] == 0) and probs[0].shape == (3, 4, 11, 11)
    row_sums = probs[0].sum(-1).transpose(0, 1)[:, real]  # (nh, real queries): the dropped keys took no weight
    torch.testing.assert_close(row_sums, torch.ones_like(row_sums), atol=1e-2, rtol=0)
    monkeypatch.setattr(kernels, "PACKED_ROW_MULTIPLE", 1)
    monkeypatch.setattr(kernels, "PADDED_LENGTH_MULTIPLE", 1)
    shapes.clear()
    exact_seq, exact_probs, exact_grads = run()
    assert shapes == [(3, 4, 11, 11), (int(real.sum()), 32)]
    torch.testing.assert_close(seq, exact_seq, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(probs[0], exact_probs[0], atol=1e-2, rtol=1e-2)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, exact_grads[name], atol=2e-2, rtol=5e-2, msg=name)


def test_packed_rows_round_up_with_padding_positions_that_unpack_drops():
    mask = torch.zeros(4, 40, dtype=torch.long)
    mask[:, :9] = 1  # 36 real tokens of 160 positions
    tokens = RealTokens(mask, torch.float32, row_multiple=64)
    assert tokens.index.shape == (64,) and torch.equal(tokens.index[:36], mask.flatten().nonzero().squeeze(1))
    assert bool((mask.flatten()[tokens.index[36:]] == 0).all())
    x = torch.randn(4, 40, 3)
    packed = tokens.pack(x)
    torch.testing.assert_close(tokens.unpack(packed)[mask.bool()], x[mask.bool()])
    assert torch.all(tokens.unpack(packed)[~mask.bool()] == 0)
    assert RealTokens(mask[:, :10], torch.float32, 64).index.shape == (40,)  # never more rows than positions


@pytest.mark.parametrize("bf16", [False, True])
def test_tied_word_embedding_gradient_reaches_the_parameter_once_per_backward(bf16):
    """The lookup's rows are added into the decoder's gradient of the shared matrix (TiedWordGradient): a dense .grad
    (what AdamW, DDP and DeepSpeed expect) reaching the Parameter once per backward, also when two micro-batches
    accumulate, equal to autograd's own sum in the plain model; rows the batch never looks up get the decoder's."""
    fast, plain = (m.eval() for m in on_and_off(BertForPreTraining, BERT))  # eval: both see the same function
    arrivals = []
    fast.bert.embeddings.word_embeddings.weight.register_post_accumulate_grad_hook(lambda p: arrivals.append(1))
    positions = torch.tensor([[1, 4, 5, 9], [0, 2, 3, 5], [10, 8, 6, 7]])
    for m in (fast, plain):
        for seed in (0, 1):  # gradient accumulation over two micro-batches
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                mlm, nsp = m(*bert_batch(seed=seed), mlm_positions=positions)
            (mlm.float().square().mean() + nsp.float().square().mean()).backward()
    grad, expected = fast.bert.embeddings.word_embeddings.weight.grad, plain.bert.embeddings.word_embeddings.weight.grad
    assert grad.layout == torch.strided and grad.dtype == torch.float32 and arrivals == [1, 1]
    torch.testing.assert_close(grad, expected, **({"atol": 2e-3, "rtol": 2e-2} if bf16 else {}))
    looked_up = torch.unique(torch.cat([bert_batch(seed=s)[0].flatten() for s in (0, 1)]))
    assert looked_up.numel() < V and grad.abs().sum(1).gt(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_keeps_one_minus_p_scaled_and_reproducible(dtype):
    dropout = CPUDropout(0.1)
    x = torch.rand(1000, 1000, dtype=dtype) + 1.0
    torch.manual_seed(3)
    out = dropout(x)
    kept = out != 0
    assert out.dtype == dtype and abs(kept.float().mean().item() - 0.9) < 5 * math.sqrt(0.9 * 0.1 / x.numel())
    torch.testing.assert_close(out[kept], (x / 0.9)[kept])
    # mask patterns are not repeating across the four 16-bit fields of each random draw
    assert not torch.equal(kept.view(-1, 4)[:, 0], kept.view(-1, 4)[:, 1])
    torch.manual_seed(3)
    assert torch.equal(dropout(x), out)  # the global generator draws the mask: seeding reproduces it
    x.requires_grad_(True)
    torch.manual_seed(3)
    dropout(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(kept, 1 / 0.9, 0.0).to(dtype))
    assert torch.equal(dropout.eval()(x), x)
    assert torch.equal(CPUDropout(0.0).train()(x), x) and not CPUDropout(1.0).train()(x).any()


def count_gemv_calls(monkeypatch) -> list[tuple[int, ...]]:
    """models/gemv.py's kernel replaced by F.linear that records the shape of each input it is given."""
    calls = []

    class CountingKernel:
        @staticmethod
        def linear_rows(x, weight, bias):
            calls.append(tuple(x.shape))
            return F.linear(x, weight, bias if bias.numel() else None)

    monkeypatch.setattr(gemv, "_kernel", CountingKernel)
    return calls


def test_decoding_steps_multiply_their_rows_by_models_gemv_and_a_prompt_by_f_linear(monkeypatch):
    """Every product of a one-token step (4 per block and the LM head) goes through models/gemv.py's kernel; a
    prompt of more than gemv.MAX_ROWS tokens and training go through F.linear."""
    calls = count_gemv_calls(monkeypatch)
    torch.manual_seed(0)
    model = use_fast_kernels(GPTLMHeadModel(GPT)).eval()
    prompt = torch.randint(0, V, (1, gemv.MAX_ROWS + 1))
    with torch.no_grad():
        cache = model.new_cache(1, prompt.size(1) + 1)
        model.next_token_logits(prompt, cache)
        assert calls == [(1, 32)]  # the prompt's last position through the LM head; its blocks were matmuls
        step = model.next_token_logits(torch.tensor([[3]]), cache)
    assert len(calls) == 1 + 4 * model.config.n_layer + 1
    full = model(torch.cat([prompt, torch.tensor([[3]])], dim=1)).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=0)
    calls.clear()
    layer = DecodingLinear(8, 24)
    layer(torch.randn(1, 8)).sum().backward()  # autograd on: nn.Linear, gradients reach the weight
    assert calls == [] and layer.weight.grad is not None


def test_the_pipeline_applies_them_where_trainer_fast_kernels_is_on(tmp_path):
    """trainer.fast_kernels (on by default) decides whether the module the pretraining harness builds, whichever
    family's, gets the kernels; the model config no longer has the switch, and a model saved with it under an earlier
    version (config.json with "fast_kernels") still loads."""
    from types import SimpleNamespace

    from models.bert import BertConfig, load_pretrained, save_pretrained
    from pipeline.engine.dag import StageContext
    from pipeline.engine.pretraining_task import built_module
    from tests.helpers import tiny_config

    task = SimpleNamespace(build_module=lambda ctx, p: torch.nn.ModuleDict({"model": BertForPreTraining(BERT)}))
    for override, fast in (([], True), (["trainer.fast_kernels=false"], False)):
        ctx = StageContext(tiny_config(tmp_path, override), "bert_pretrain", tmp_path / "out")
        module = built_module(task, ctx, None)
        assert (type(module["model"].bert.encoder) is kernels.PackedBertEncoder) is fast
    assert "fast_kernels" not in {f.name for f in dataclasses.fields(BertConfig)}
    save_pretrained(BertModel(BERT), tmp_path / "encoder")
    config = tmp_path / "encoder" / "config.json"
    config.write_text(config.read_text().replace('{', '{"fast_kernels": false, ', 1))
    assert type(load_pretrained(tmp_path / "encoder").encoder) is not kernels.PackedBertEncoder  # built plain
