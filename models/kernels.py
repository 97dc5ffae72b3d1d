"""The speed work of models/bert.py, models/gpt.py and models/seq2seq.py, apart from the architecture: faster modules
that compute what those files' modules compute, swapped into a built model from outside by use_fast_kernels(model)
(as torchtitan's `parallelize` applies its speed work to a plain model). The models never import this file: the
pipeline calls it where it builds a model to train or run (the pretraining harness, the fine-tune stage, the frozen
encoders, decoding), where its runtime setting `trainer.fast_kernels` is on (the default), and never saves it with
the weights: a model's config says what it computes, not how fast.

    CPUDropout                 nn.Dropout with a mask drawn 16 bits per element instead of a float
    FusedBertSelfAttention     one matmul for q, k and v; on the CPU, dropout on the explicit softmax path
    PackedBertEncoder          the layers run on the real tokens alone (RealTokens), in few shapes under CPU autocast
    TiedWordEmbedding/Decoder  the tied word-embedding matrix's gradient summed in place (TiedWordGradient)
    DecodingLinear, DecodingGPTLMHeadModel   a decoding step's few-row products by models/gemv.py's kernel
    FusedSeq2SeqAttention, DecodingGenerator the encoder-decoder's: one matmul for the projections of one input,
                                             and its decoding steps' products by models/gemv.py's kernel

A fast module is a subclass of the plain one with the same parameters, buffers and state-dict keys: the swap changes
the class of a built module and nothing else, so checkpoints, HF conversion and optimizers never see it. Outputs and
gradients equal the plain model's to float rounding (tests/models/test_kernels.py); dropout masks differ (another
draw, and p rounded to a multiple of 1/65536). What each one buys, measured: docs/kernels.md.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models import gemv
from models.bert import BertEncoder, BertPreTrainedModel, BertSelfAttention, additive_attention_mask
from models.gpt import MLP, CausalSelfAttention, GPTLMHeadModel, KVCache
from models.rnn_seq2seq import RNNEncoderDecoder
from models.seq2seq import Attention as Seq2SeqAttention
from models.seq2seq import EncoderDecoder, Generator, Layer

# The models whose modules get the fast twins: every BERT model (the encoder, the pretraining models, ELECTRA, the task
# models with their heads), the GPT language model (not a task head on it), the encoder-decoders. Modules outside
# them keep their classes: ELMo's and Skip-Thought's, a GPT task head's, whatever holds the model (a LightningModule).
FAST_MODELS = (BertPreTrainedModel, GPTLMHeadModel, EncoderDecoder, RNNEncoderDecoder)


def use_fast_kernels(model: nn.Module) -> nn.Module:
    """Swap, in place, every module that has a fast twin here for it, inside each of FAST_MODELS that `model` is or
    holds (its outermost ones); modules already swapped are left as they are, so a model may be given again after
    modules were added to it. Returns `model`."""
    for fast_model in _outermost(model, FAST_MODELS):
        _swap(fast_model)
    return model


def _outermost(model: nn.Module, kinds: tuple[type, ...]) -> list[nn.Module]:
    if isinstance(model, kinds):
        return [model]
    return [found for child in model.children() for found in _outermost(child, kinds)]


def _swap(model: nn.Module) -> None:
    for module in model.modules():
        fast = FAST_TWINS.get(type(module))
        if fast is not None:
            module.__class__ = fast
        if isinstance(module, (CausalSelfAttention, MLP, Seq2SeqAttention, Layer)):
            for linear in module.children():
                if type(linear) is nn.Linear:
                    linear.__class__ = DecodingLinear
    _tie_word_gradients(model)


# -----------------------------------------------------------------------------
# Dropout


def cpu_keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """Bool mask, True with probability 1 - p (p rounded to a multiple of 1/65536: 0.1 -> 0.100006): every 64-bit draw
    of torch's global generator gives four 16-bit uniforms, one per element."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits random
    threshold = round(p * 65536) - 32768  # P(int16 < threshold) = p
    return (bits.view(torch.int16)[:n] >= threshold).view(shape)


class CPUDropout(nn.Dropout):
    """nn.Dropout (inverted: kept values scaled by 1 / (1 - p)) whose CPU mask costs a quarter of a random draw per
    element, where PyTorch's CPU dropout draws a float per element with bernoulli_. The global generator draws the
    bits, so torch.manual_seed and a restored RNG state reproduce the masks. Elsewhere (GPUs), F.dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:  # the identity, without F.dropout's call (a GPT decoding step has many)
            return x
        if not 0.0 < self.p < 1.0 or x.device.type != "cpu":
            return super().forward(x)
        return torch.where(cpu_keep_mask(x.shape, self.p), x * (1.0 / (1.0 - self.p)), 0.0)


# -----------------------------------------------------------------------------
# BERT: attention and the encoder over the real tokens


# Under CPU autocast, packed rows come in multiples of this (RealTokens): at most B*T/64 row counts, whose kernels
# oneDNN keeps, for at most 63 rows of padding per batch (~3 % of a fine-tuning batch of 32 sentences). oneDNN builds
# its bf16 kernels per shape, and sentence batches bring a new shape almost every step; CUDA has no such cost, so it
# keeps the exact shapes (docs/kernels.md).
ROUNDED_SHAPE_DEVICES = ("cpu",)
PACKED_ROW_MULTIPLE = 64
PADDED_LENGTH_MULTIPLE = 8  # and batches are padded to a multiple of 8 positions (HF's pad_to_multiple_of)


class RealTokens:
    """Where the real tokens of a padded (B, T) batch are. Every layer except attention works token by token, so it can
    run on the N real tokens alone, packed as (N, H) ("unpadding", as in NVIDIA's DeepLearningExamples BERT and
    MosaicBERT); attention alone needs the (B, T) layout back, with zeros at the padding, which its mask hides anyway.
    Padding then costs no matmul work outside attention: it is a quarter of the positions in this project's phase-2
    examples at 512, and most positions of fine-tuning batches of short sentences.

    PackedBertEncoder hands it to the layers as their attention mask, so that the plain layers pass it through to
    FusedBertSelfAttention unchanged; `attention_mask` is the additive mask attention adds."""

    def __init__(self, attention_mask: torch.Tensor, dtype: torch.dtype, row_multiple: int = 1):
        self.batch_size, self.seq_len = attention_mask.shape  # (B, T), 1 = token, 0 = padding
        flat = attention_mask.flatten()
        self.index = flat.nonzero().squeeze(1)  # (N,) positions of the real tokens in the flattened batch
        self.num_real = self.index.numel()
        # The packed rows are rounded up to a multiple of row_multiple with padding positions, whose results are
        # dropped (PACKED_ROW_MULTIPLE).
        rows = min(-(-self.num_real // row_multiple) * row_multiple, flat.numel())
        if rows > self.num_real:  # (rows,): the real tokens first, then padding positions
            padding = (flat == 0).nonzero().squeeze(1)[: rows - self.num_real]
            self.index = torch.cat([self.index, padding])
        self.attention_mask = additive_attention_mask(attention_mask, dtype)  # (B, 1, 1, T)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(0, 1).index_select(0, self.index)  # (B, T, D) -> (rows, D)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        # the rows of padding positions are dropped: zeros there, as if never computed
        n = self.num_real
        padded = x.new_zeros(self.batch_size * self.seq_len, x.size(-1)).index_copy(0, self.index[:n], x[:n])
        return padded.view(self.batch_size, self.seq_len, -1)  # (rows, D) -> (B, T, D), zeros at the padding


class PackedBertEncoder(BertEncoder):
    """BertEncoder whose layers skip the padding (RealTokens); under CPU autocast, in few shapes (PACKED_ROW_MULTIPLE,
    PADDED_LENGTH_MULTIPLE)."""

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        if attention_mask is None:
            return super().forward(hidden_states, None, output_attentions)
        length, device = hidden_states.size(1), hidden_states.device.type
        rounded = device in ROUNDED_SHAPE_DEVICES and torch.is_autocast_enabled(device)
        if rounded and length % PADDED_LENGTH_MULTIPLE:
            # attention's products are (B*nh, T, T): a few lengths, a few oneDNN kernels (as PACKED_ROW_MULTIPLE)
            extra = -length % PADDED_LENGTH_MULTIPLE
            hidden_states, attention_mask = F.pad(hidden_states, (0, 0, 0, extra)), F.pad(attention_mask, (0, extra))
        if bool(attention_mask.all()):
            tokens, mask = None, additive_attention_mask(attention_mask, hidden_states.dtype)
        else:
            tokens = mask = RealTokens(attention_mask, hidden_states.dtype,
                                       row_multiple=PACKED_ROW_MULTIPLE if rounded else 1)
            hidden_states = tokens.pack(hidden_states)  # (rows, H)
        sequence_output, all_probs = self.run_layers(hidden_states, mask, output_attentions)
        if tokens is not None:
            sequence_output = tokens.unpack(sequence_output)  # zeros at the padding
        if sequence_output.size(1) != length:  # padded to PADDED_LENGTH_MULTIPLE above
            sequence_output = sequence_output[:, :length]
            all_probs = [None if probs is None else probs[..., :length, :length] for probs in all_probs]
        return sequence_output, all_probs


class FusedBertSelfAttention(BertSelfAttention):
    """BertSelfAttention with one matmul for the three projections: the input is read (and under autocast cast) once,
    and its gradient comes out of one matmul instead of being summed from three. Takes the packed rows of RealTokens.
    On the CPU, with dropout, the explicit softmax path with CPUDropout's mask: SDPA's fused CPU kernel takes no
    dropout, and its fallback draws the mask with bernoulli_."""

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        tokens = attention_mask if isinstance(attention_mask, RealTokens) else None
        if tokens is not None:
            attention_mask = tokens.attention_mask
        H = hidden_states.size(-1)
        nh, hs = self.num_attention_heads, self.attention_head_size
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(hidden_states, weight, bias)
        if tokens is not None:
            qkv = tokens.unpack(qkv)  # (B, T, 3H)
        B, T = qkv.shape[:2]
        q, k, v = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs) each
        cpu_dropout = self.training and self.dropout.p > 0.0 and hidden_states.device.type == "cpu"
        context, probs = self.attend(q, k, v, attention_mask, with_probs=output_attentions or cpu_dropout)
        context = context.transpose(1, 2).reshape(B, T, H)
        return (context if tokens is None else tokens.pack(context)), probs


# -----------------------------------------------------------------------------
# BERT: the tied word-embedding gradient


class TiedWordGradient:
    """Hands the MLM decoder's dense (V, H) gradient of the tied word-embedding matrix from the decoder's backward to
    the word lookup's backward, which adds the rows it looked up in place and returns the sum as the matrix's only
    gradient. Left to autograd, a matrix used twice gets its two gradients summed out of place: a fresh (V, H) tensor
    read through the transposed layout of the decoder's gradient. The lookup's backward always runs after the
    decoder's, since every state the decoder reads depends on the lookup."""

    def __init__(self):
        self.from_decoder: torch.Tensor | None = None


class _LookupWithTiedGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_ids, weight, tied: TiedWordGradient):
        ctx.save_for_backward(input_ids)
        ctx.tied, ctx.weight_shape, ctx.weight_dtype = tied, weight.shape, weight.dtype
        tied.from_decoder = None  # a new forward: nothing left over from a backward that never reached the lookup
        return F.embedding(input_ids, weight)

    @staticmethod
    def backward(ctx, grad):
        (input_ids,) = ctx.saved_tensors
        grad_weight, ctx.tied.from_decoder = ctx.tied.from_decoder, None
        if grad_weight is None:
            grad_weight = grad.new_zeros(ctx.weight_shape, dtype=ctx.weight_dtype)
        grad_weight.index_add_(0, input_ids.flatten(), grad.reshape(-1, grad.size(-1)).to(grad_weight.dtype))
        return None, grad_weight, None


class _DecoderWithTiedGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, tied: TiedWordGradient):
        # autocast's casts made explicitly, so that backward computes in the same dtype
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        hidden, cast_weight = hidden.to(dtype), weight.to(dtype)
        ctx.save_for_backward(hidden, cast_weight)
        ctx.tied, ctx.weight_dtype = tied, weight.dtype
        return F.linear(hidden, cast_weight)  # (..., V)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        grad = grad.to(weight.dtype)
        flat_grad, flat_hidden = grad.reshape(-1, grad.size(-1)), hidden.reshape(-1, hidden.size(-1))
        ctx.tied.from_decoder = (flat_grad.t() @ flat_hidden).to(ctx.weight_dtype)  # (V, H), contiguous
        return grad @ weight, None, None


class TiedWordEmbedding(nn.Embedding):
    """The word lookup of a model whose decoder shares its matrix (see TiedWordGradient); a plain nn.Embedding
    whenever no gradient is taken."""
    tied: TiedWordGradient

    def forward(self, input_ids):
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(input_ids)
        return _LookupWithTiedGradient.apply(input_ids, self.weight, self.tied)


class TiedDecoder(nn.Linear):
    """Scores over the vocabulary with the word-embedding matrix as weights (no bias); its gradient of that matrix
    goes to the lookup (TiedWordGradient)."""
    tied: TiedWordGradient

    def forward(self, hidden_states):
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(hidden_states)
        return _DecoderWithTiedGradient.apply(hidden_states, self.weight, self.tied)


def _tie_word_gradients(model: nn.Module) -> None:
    """Every bias-free nn.Linear whose weight is an nn.Embedding's (BERT's and ELECTRA's MLM decoders) becomes a
    TiedDecoder, and that lookup a TiedWordEmbedding, sharing one TiedWordGradient."""
    lookups = {id(m.weight): m for m in model.modules() if type(m) is nn.Embedding}
    for decoder in model.modules():
        lookup = lookups.get(id(getattr(decoder, "weight", None)))
        if type(decoder) is nn.Linear and decoder.bias is None and lookup is not None:
            lookup.tied = decoder.tied = TiedWordGradient()
            lookup.__class__, decoder.__class__ = TiedWordEmbedding, TiedDecoder


# -----------------------------------------------------------------------------
# GPT: decoding steps


class DecodingLinear(nn.Linear):
    """nn.Linear whose products of a few rows outside autograd (a decoding step) go through models/gemv.py, which
    streams the weight from memory faster than F.linear on this project's CPUs (docs/gpt.md)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemv.linear(x, self.weight, self.bias)


class DecodingGPTLMHeadModel(GPTLMHeadModel):
    """GPTLMHeadModel whose decoding step multiplies by the LM head through models/gemv.py: at gpt_small the head is
    154 MB of the 494 MB a decoding step reads."""

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return gemv.linear(self.transformer(idx, cache)[:, -1], self.transformer.wte.weight)  # (B, C) x (V, C)^T


# -----------------------------------------------------------------------------
# The encoder-decoder


class FusedSeq2SeqAttention(Seq2SeqAttention):
    """models.seq2seq's Attention whose projections of one input (q, k and v; the memory's k and v) are one matmul
    against their stacked weights: the input is read once, and in training its gradient comes out of one matmul
    (FusedBertSelfAttention's). Not for the few rows of a decoding step, whose products stream each weight through
    models/gemv.py (DecodingLinear): stacking would copy every weight once more per token."""

    def project(self, x: torch.Tensor, *linears: nn.Linear) -> list[torch.Tensor]:
        if not torch.is_grad_enabled() and x.numel() // x.size(-1) <= gemv.MAX_ROWS:
            return super().project(x, *linears)
        weight = torch.cat([linear.weight for linear in linears])
        bias = torch.cat([linear.bias for linear in linears])
        return list(F.linear(x, weight, bias).chunk(len(linears), dim=-1))


class DecodingGenerator(Generator):
    """models.seq2seq's Generator whose decoding step multiplies by the tied embedding matrix through models/gemv.py."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return gemv.linear(x, weight, self.bias)


FAST_TWINS: dict[type, type] = {
    nn.Dropout: CPUDropout,
    BertSelfAttention: FusedBertSelfAttention,
    BertEncoder: PackedBertEncoder,
    GPTLMHeadModel: DecodingGPTLMHeadModel,
    Seq2SeqAttention: FusedSeq2SeqAttention,
    Generator: DecodingGenerator,
}
