"""
The Transformer encoder-decoder (Vaswani et al. 2017) in one file of plain PyTorch, as seed 000 (the Annotated
Transformer) builds it: an encoder stack of self-attention and feed-forward layers, a decoder stack whose layers add
attention over the encoder's output (the "memory") to masked self-attention, shared source/target/output embeddings,
a Generator, the label-smoothed loss, and seed 000's greedy_decode; with copy_attention, See et al. 2017's
pointer-generator mixes copying from the source into the Generator's distribution.

Read top to bottom: config -> masks -> positions -> attention -> layers -> Encoder, Decoder -> Generator,
PointerGenerator -> EncoderDecoder -> label smoothing -> decoding state -> greedy_decode -> checkpoint I/O. Greedy,
sampling and beam search are models/generation.py's, shared with GPT; HuggingFace BART conversion is
models/hf/seq2seq.py's.

Module and parameter names are those of HF's BartForConditionalGeneration (`encoder.layers.0.self_attn.q_proj`,
`self_attn_layer_norm`, `encoder_attn`, `fc1`, `final_layer_norm`, `shared`), so converting is renaming prefixes.
The defaults are seed 000's model: pre-LN blocks with a final LayerNorm per stack, fixed sinusoidal positions, token
embeddings scaled by sqrt(d_model), ReLU. BART (Lewis et al. 2020) is the same architecture with post-LN blocks, a
LayerNorm on the embeddings, learned positions offset by 2 and GELU: `bart_config` gives those options.

The speed work (one matmul for several projections of one input, CPU dropout masks, a kernel of our own for the few-row
products of a decoding step) lives in models/kernels.py, whose use_fast_kernels(model) swaps it into a built model
from outside (the pipeline does, where it builds a model to train or run: trainer.fast_kernels).
"""

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from models import IGNORE_INDEX
from models.bert import sinusoidal_position_table
from models.checkpoint import load_checkpoint, save_checkpoint
from models.gpt import KVCache

POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # gelu: the exact (erf) GELU, HF's "gelu" as BART uses


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 32000  # one vocabulary for source and target: the embeddings are shared (Press & Wolf 2017)
    d_model: int = 512  # defaults are seed 000's base model (Vaswani et al. Table 3)
    encoder_layers: int = 6
    decoder_layers: int = 6
    n_head: int = 8  # head size d_model / n_head
    d_ff: int = 2048  # the position-wise feed-forward's inner width
    max_positions: int = 512  # the longest source, and the most decoder positions, either position scheme covers
    # Dropout sites, named as BART's: `dropout` on every sublayer's output and on the embeddings (seed 000's P_drop =
    # 0.1), `attention_dropout` on the attention probabilities, `activation_dropout` inside the feed-forward (seed 000
    # drops at both with P_drop; BART's defaults are 0)
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"  # seed 000's ReLU; BART's GELU
    # "sinusoidal": Vaswani et al. Sec. 3.5's fixed table (no parameters); "learned": a trained table, as BART's, whose
    # first learned_position_offset rows are never used (BART: 2, fairseq's padding_idx + 1)
    position_embedding_type: str = "sinusoidal"
    learned_position_offset: int = 0
    # True: pre-LN, LayerNorm on each sublayer's input and once after each stack (seed 000's SublayerConnection; it
    # trains without warm-up tuning, Xiong et al. 2020). False: post-LN, LayerNorm after each residual add (the paper's,
    # BART's)
    pre_layer_norm: bool = True
    layernorm_embedding: bool = False  # a LayerNorm on the embedded tokens + positions (BART)
    scale_embedding: bool = True  # token embeddings x sqrt(d_model) (Vaswani et al. Sec. 3.4; BART: False)
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 0  # right-pads sources in a batch; never attended to (masked) nor scored (IGNORE_INDEX)
    decoder_start_token_id: int = 1  # the decoder's first input: every target is predicted after it
    eos_token_id: int | None = 2  # ends a target; decoding stops when it is produced (None: at max_new_tokens)
    # Label smoothing (Szegedy et al. 2016) of the training loss: seed 000's LabelSmoothing with Vaswani et al.'s 0.1.
    # The eval-mode loss is never smoothed
    label_smoothing: float = 0.1
    # See et al. 2017's pointer-generator (PointerGenerator): the output also copies source tokens by the last decoder
    # layer's attention over the memory, for targets that repeat words of their source (headlines, names, numbers)
    copy_attention: bool = False

    def __post_init__(self):
        if self.d_model % self.n_head != 0:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(f"position_embedding_type must be one of {POSITION_EMBEDDING_TYPES}, "
                             f"got {self.position_embedding_type!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} {value} is outside the vocabulary of {self.vocab_size}")


# Named sizes. seq2seq_tiny and seq2seq_small have bert_tiny's and bert_small's shapes on each side (Turc et al. 2019),
# so the families compare at equal width; transformer_base is seed 000's (and Vaswani et al.'s) base model.
SEQ2SEQ_SIZES: dict[str, dict] = {
    "seq2seq_tiny": dict(encoder_layers=2, decoder_layers=2, d_model=128, n_head=2, d_ff=512),
    "seq2seq_small": dict(encoder_layers=4, decoder_layers=4, d_model=512, n_head=8, d_ff=2048),
    "transformer_base": dict(encoder_layers=6, decoder_layers=6, d_model=512, n_head=8, d_ff=2048),
}

# What makes the Transformer BART's (Lewis et al. 2020, as HF's BartConfig computes it).
BART_OPTIONS = dict(pre_layer_norm=False, layernorm_embedding=True, position_embedding_type="learned",
                    learned_position_offset=2, activation="gelu", scale_embedding=False)


def seq2seq_config(name: str, **overrides) -> Seq2SeqConfig:
    """The named size from SEQ2SEQ_SIZES with any Seq2SeqConfig field overridden."""
    if name not in SEQ2SEQ_SIZES:
        raise KeyError(f"unknown seq2seq size {name!r}; known: {sorted(SEQ2SEQ_SIZES)}")
    return Seq2SeqConfig(**{**SEQ2SEQ_SIZES[name], **overrides})


def bart_config(name: str, **overrides) -> Seq2SeqConfig:
    """The named size as BART computes it (BART_OPTIONS): post-LN, LayerNorm on the embeddings, learned positions."""
    return seq2seq_config(name, **{**BART_OPTIONS, **overrides})


# -----------------------------------------------------------------------------
# Masks


def subsequent_mask(size: int, past: int = 0, device=None) -> torch.Tensor:
    """Seed 000's subsequent_mask: (size, past + size) booleans, True where the query at position past + i may attend
    to key j, i.e. j <= past + i. Decoder position t sees the targets before it and itself, never a later one, so
    training on a whole target at once (teacher forcing) predicts each token from its past alone."""
    query = past + torch.arange(size, device=device)[:, None]  # (size, 1)
    return torch.arange(past + size, device=device) <= query  # (size, past + size)


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) 1 = token, 0 = padding -> the boolean key mask (B, 1, 1, S) broadcast over heads and queries, or None
    when nothing is padded (SDPA then needs no mask)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


# -----------------------------------------------------------------------------
# Positions


class SinusoidalPositions(nn.Module):
    """Vaswani et al. Sec. 3.5 (seed 000's PositionalEncoding): a fixed function of the position, so a buffer rebuilt
    from the config, not a parameter (and not saved)."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.register_buffer("table", sinusoidal_position_table(config.max_positions, config.d_model),
                             persistent=False)

    def forward(self, past: int, T: int) -> torch.Tensor:
        return self.table[past: past + T]  # (T, d)


class LearnedPositions(nn.Embedding):
    """A trained position table (BART's BartLearnedPositionalEmbedding): position p reads row p + offset."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config.max_positions + config.learned_position_offset, config.d_model)
        self.offset = config.learned_position_offset

    def forward(self, past: int, T: int) -> torch.Tensor:
        return self.weight[past + self.offset: past + self.offset + T]  # (T, d)


# -----------------------------------------------------------------------------
# Attention


class Attention(nn.Module):
    """Multi-head scaled dot-product attention (seed 000's MultiHeadedAttention; BartAttention's names), through
    F.scaled_dot_product_attention. Self-attention reads queries, keys and values from its input; the decoder's
    attention over the encoder reads keys and values from the memory (keys_values, once per source)."""

    def __init__(self, config: Seq2SeqConfig, layer: int = 0):
        super().__init__()
        d = config.d_model
        self.n_head, self.layer, self.attention_dropout = config.n_head, layer, config.attention_dropout
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def project(self, x: torch.Tensor, *linears: nn.Linear) -> list[torch.Tensor]:
        """x through each of `linears` (q, k and v of self-attention; k and v of the memory)."""
        return [linear(x) for linear in linears]

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        dropout_p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        B, nh, T, hs = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, nh * hs))  # (B, T, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None) -> torch.Tensor:
        """Self-attention over x (B, T, d) with the boolean mask (True = may attend) broadcastable to (B, nh, T, S).
        With `cache`, x are the T positions after those the cache holds, whose keys and values are appended to it."""
        q, k, v = (self._heads(t) for t in self.project(x, self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = cache.append(self.layer, k, v)  # (B, nh, S, hs), S = past + T
        return self._attend(q, k, v, mask)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values (B, nh, S, hs) of the encoder's output `memory` (B, S, d)."""
        k, v = self.project(memory, self.k_proj, self.v_proj)
        return self._heads(k), self._heads(v)

    def cross(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of x (B, T, d) over the memory's keys and values (keys_values) under its padding mask -> its output
        (B, T, d) and, with need_weights, the attention probabilities averaged over heads (B, T, S), zero at padding,
        before dropout (what the pointer-generator copies by). Memory of one source under B > 1 rows (the beams of
        beam search): the B x T queries attend as one row's, so the source's keys and values are neither copied per
        beam nor reordered with them."""
        q = self._heads(self.q_proj(x))  # (B, nh, T, hs)
        B, nh, T, hs = q.shape
        weights = None
        if need_weights:  # SDPA does not return its probabilities: recomputed, a (B, nh, T, S) product
            scores = (q @ k.transpose(-1, -2)) * hs ** -0.5  # k of one source broadcasts over the beams
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(-1).mean(1)  # (B, T, S)
        if k.size(0) == 1 < B:
            q = q.transpose(0, 1).reshape(1, nh, B * T, hs)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # eval only: beam search
            return self.out_proj(y.view(nh, B, T, hs).permute(1, 2, 0, 3).reshape(B, T, nh * hs)), weights
        return self._attend(q, k, v, mask), weights


# -----------------------------------------------------------------------------
# Layers


class Layer(nn.Module):
    """What encoder and decoder layers share: seed 000's SublayerConnection (residual, dropout and LayerNorm around a
    sublayer, pre- or post-LN) and PositionwiseFeedForward (fc1 -> activation -> dropout -> fc2)."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.activation = ACTIVATIONS[config.activation]
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def sublayer(self, x: torch.Tensor, norm: nn.LayerNorm, fn) -> torch.Tensor:
        """Pre-LN: x + dropout(fn(norm(x))) (seed 000). Post-LN: norm(x + dropout(fn(x))) (Vaswani et al., BART)."""
        return self.residual(x, fn(self.sublayer_input(x, norm)), norm)

    def sublayer_input(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return norm(x) if self.pre_layer_norm else x

    def residual(self, x: torch.Tensor, y: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """x and the sublayer's output y of it added (sublayer)."""
        return x + self.dropout(y) if self.pre_layer_norm else norm(x + self.dropout(y))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(x))))


class EncoderLayer(Layer):
    """Self-attention over the source, then the feed-forward (seed 000's EncoderLayer)."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config)
        self.self_attn = Attention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.sublayer(x, self.self_attn_layer_norm, lambda h: self.self_attn(h, mask))
        return self.sublayer(x, self.final_layer_norm, self.feed_forward)


class DecoderLayer(Layer):
    """Masked self-attention over the target so far, attention over the encoder's memory, then the feed-forward
    (seed 000's DecoderLayer: self_attn, src_attn, feed_forward)."""

    def __init__(self, config: Seq2SeqConfig, layer: int):
        super().__init__(config)
        self.self_attn = Attention(config, layer)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = Attention(config, layer)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, x, mask, memory_kv, memory_mask, cache=None, need_weights: bool = False):
        """x (B, T, d) -> the layer's output (B, T, d), its attention over the memory's output (the context, (B, T, d))
        and, with need_weights, that attention's probabilities (B, T, S) (Attention.cross)."""
        x = self.sublayer(x, self.self_attn_layer_norm, lambda h: self.self_attn(h, mask, cache))
        context, weights = self.encoder_attn.cross(self.sublayer_input(x, self.encoder_attn_layer_norm), *memory_kv,
                                                   memory_mask, need_weights)
        x = self.residual(x, context, self.encoder_attn_layer_norm)
        return self.sublayer(x, self.final_layer_norm, self.feed_forward), context, weights


# -----------------------------------------------------------------------------
# Stacks


class Stack(nn.Module):
    """What the encoder and decoder stacks share: embedding the (already looked-up) tokens with their positions, and
    pre-LN's final LayerNorm (seed 000's Encoder.norm, Decoder.norm: pre-LN layers never normalise the residual stream
    itself)."""

    def __init__(self, config: Seq2SeqConfig, layers: list[Layer]):
        super().__init__()
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = (LearnedPositions(config) if config.position_embedding_type == "learned"
                                else SinusoidalPositions(config))
        self.layernorm_embedding = (nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
                                    if config.layernorm_embedding else nn.Identity())
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = (nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.pre_layer_norm
                           else nn.Identity())
        self.max_positions = config.max_positions

    def embed(self, token_embeddings: torch.Tensor, past: int = 0) -> torch.Tensor:
        """token_embeddings (B, T, d) at positions past..past+T-1 -> the first layer's input (B, T, d)."""
        T = token_embeddings.size(1)
        if past + T > self.max_positions:
            raise ValueError(f"a sequence of {past + T} positions is longer than the model's max_positions="
                             f"{self.max_positions}; shorten it, or build the model with more positions")
        x = token_embeddings * self.embed_scale + self.embed_positions(past, T)
        return self.dropout(self.layernorm_embedding(x))


class Encoder(Stack):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config, [EncoderLayer(config) for _ in range(config.encoder_layers)])

    def forward(self, token_embeddings: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The source's embedded tokens (B, S, d) and padding mask (padding_mask) -> the memory (B, S, d)."""
        x = self.embed(token_embeddings)
        for layer in self.layers:
            x = layer(x, mask)
        return self.layer_norm(x)


class Memory(NamedTuple):
    """The encoder's output as the decoder reads it: each decoder layer's keys and values of it, computed once per
    source however many tokens are decoded, the source's padding mask, and its ids (what copy_attention copies)."""
    keys_values: list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer, (B, nh, S, hs) each
    mask: torch.Tensor | None  # (B, 1, 1, S), True = source token
    input_ids: torch.Tensor  # (B, S)


class DecoderOutput(NamedTuple):
    """What the decoder gives for T target positions: the states the Generator scores, and what the pointer-generator
    reads besides."""
    states: torch.Tensor  # (B, T, d): the final states
    inputs: torch.Tensor  # (B, T, d): the embedded decoder inputs, the first layer's input
    context: torch.Tensor  # (B, T, d): the last layer's attention over the memory, its output
    attention: torch.Tensor | None  # (B, T, S): that attention's probabilities averaged over heads (copy_attention)


def last_position(out: NamedTuple) -> NamedTuple:
    """A decoder's output (either model's DecoderOutput) at its last position, each field (B, 1, ...): what a decoding
    step scores."""
    return type(out)(*(None if t is None else t[:, -1:] for t in out))


class Decoder(Stack):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config, [DecoderLayer(config, layer) for layer in range(config.decoder_layers)])
        self.copy_attention = config.copy_attention

    def memory(self, states: torch.Tensor, mask: torch.Tensor | None, input_ids: torch.Tensor) -> Memory:
        return Memory([layer.encoder_attn.keys_values(states) for layer in self.layers], mask, input_ids)

    def forward(self, token_embeddings: torch.Tensor, memory: Memory, cache: KVCache | None = None) -> DecoderOutput:
        """The target's embedded tokens (B, T, d), or with `cache` the T after those it holds (then appended to it)
        -> the DecoderOutput, whose attention is the last layer's with copy_attention, else None."""
        past, T = (0 if cache is None else cache.length), token_embeddings.size(1)
        if cache is not None and past + T > cache.max_len:
            raise ValueError(f"the KV cache holds {cache.max_len} positions, {past + T} needed; allocate it longer")
        x = inputs = self.embed(token_embeddings, past)
        mask = subsequent_mask(T, past, x.device) if T > 1 else None  # one newest query may see every key
        last = len(self.layers) - 1
        for i, (layer, memory_kv) in enumerate(zip(self.layers, memory.keys_values)):
            x, context, attention = layer(x, mask, memory_kv, memory.mask, cache, self.copy_attention and i == last)
        if cache is not None:
            cache.length += T
        return DecoderOutput(self.layer_norm(x), inputs, context, attention)


# -----------------------------------------------------------------------------
# The model


class Generator(nn.Module):
    """Seed 000's Generator: the decoder's states -> scores over the vocabulary, a linear layer whose weight is the
    shared embedding matrix (tied, Press & Wolf 2017) and whose bias is its own (HF BART's final_logits_bias). It
    returns logits, not seed 000's log-probabilities: the loss (LabelSmoothing) and the decoding take the
    log-softmax themselves."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, self.bias)  # (..., V)


class PointerGenerator(nn.Module):
    """See et al. 2017's pointer-generator over one vocabulary shared by source and target: a gate
    p_gen = sigmoid(w . [context; decoder state; decoder input] + b) mixes the vocabulary distribution with the
    attention over the source scattered onto the source's token ids,
        P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{s: x_s = w} a_s,
    so a source token can be written however unlikely the Generator finds it. Padding has zero attention, so it gets
    no copy mass; a shared vocabulary needs no extension for out-of-vocabulary words (See et al.'s extended one).
    Both encoder-decoders use it (models/rnn_seq2seq.py too)."""

    def __init__(self, width: int):
        super().__init__()
        self.p_gen = nn.Linear(width, 1)  # width: that of [context; decoder state; decoder input]

    def forward(self, logits: torch.Tensor, features: torch.Tensor, attention: torch.Tensor,
                source_ids: torch.Tensor) -> torch.Tensor:
        """logits (B, T, V) of the vocabulary, features (B, T, width), attention (B, T, S) over source_ids (B, S), or
        (1, S) under B beams of one source -> the mixture's log-probabilities (B, T, V) in fp32, as the logaddexp of
        the two terms' logs, so the vocabulary's term never underflows to log 0."""
        gate = self.p_gen(features).float()  # (B, T, 1)
        copy = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_add_(
            -1, source_ids[:, None].expand(attention.shape), attention.float())  # (B, T, V)
        # the tokens outside the source have log 0: clamped, so that their gradient is 0 rather than 0 * inf
        log_copy = copy.clamp_min(torch.finfo(torch.float32).tiny).log()
        return torch.logaddexp(F.logsigmoid(gate) + logits.float().log_softmax(-1), F.logsigmoid(-gate) + log_copy)


class Seq2SeqOutput(NamedTuple):
    # (B, T, V): scores of the target token at each decoder position; with copy_attention the mixture's
    # log-probabilities, which are their own log_softmax, so the loss and the decoding read them as logits
    logits: torch.Tensor
    loss: torch.Tensor | None  # the label-smoothed loss against `targets` (LabelSmoothing), when given


class EncoderDecoder(nn.Module):
    """Seed 000's EncoderDecoder: encode the source once, decode the target from it, score the vocabulary with the
    Generator. One embedding matrix `shared` embeds source and target tokens and is the Generator's weight."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = Generator(config)
        self.pointer = PointerGenerator(3 * config.d_model) if config.copy_attention else None
        self.criterion = LabelSmoothing(config.label_smoothing)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        # seed 000 (and fairseq's Transformer): Glorot-uniform weight matrices, zero biases; embeddings ~ N(0, d^-1/2),
        # so that scaled by sqrt(d) they have unit variance, the sinusoids' scale (Vaswani et al. Sec. 3.4)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(mean=0.0, std=self.config.d_model ** -0.5)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        self.generator.bias.zero_()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Memory:
        """Source ids (B, S) and attention_mask (B, S) (1 = token, 0 = padding; None: no padding) -> the Memory."""
        mask = padding_mask(attention_mask)
        return self.decoder.memory(self.encoder(self.shared(input_ids), mask), mask, input_ids)

    def encoder_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Source ids and attention_mask (B, S) -> the encoder's final states (B, S, d): the memory before the decoder
        layers project it, and what a frozen sentence encoder averages (models.rnn_seq2seq has the same method)."""
        return self.encoder(self.shared(input_ids), padding_mask(attention_mask))

    def describe(self) -> str:
        """The architecture in a line, for a run's report."""
        c = self.config
        return (f"Transformer encoder-decoder (seed 000; Vaswani et al. 2017): {c.encoder_layers} + "
                f"{c.decoder_layers} layers, d_model {c.d_model}, {c.n_head} heads, d_ff {c.d_ff}, "
                f"{'pre' if c.pre_layer_norm else 'post'}-LN, {c.position_embedding_type} positions"
                + (", copy attention" if c.copy_attention else ""))

    def decode(self, decoder_input_ids: torch.Tensor, memory: Memory, cache: KVCache | None = None) -> DecoderOutput:
        """Decoder input ids (B, T) (see Decoder.forward for `cache`) -> the DecoderOutput."""
        return self.decoder(self.shared(decoder_input_ids), memory, cache)

    def scores(self, out: DecoderOutput, memory: Memory) -> torch.Tensor:
        """The decoder's output for T positions -> scores (B, T, V) of the next token at each: the Generator's logits,
        or with copy_attention the pointer-generator's log-probabilities."""
        logits = self.generator(out.states, self.shared.weight)
        if self.pointer is None:
            return logits
        return self.pointer(logits, torch.cat([out.context, out.states, out.inputs], dim=-1), out.attention,
                            memory.input_ids)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> Seq2SeqOutput:
        """input_ids (B, S) the source, right-padded, with attention_mask (B, S); decoder_input_ids (B, T) the target
        after the decoder start token (shift_right); targets (B, T) the target token at each decoder position
        (IGNORE_INDEX = not scored, e.g. padding). The loss is label-smoothed in training mode only, so that in eval
        mode exp(loss) is the perplexity."""
        memory = self.encode(input_ids, attention_mask)
        logits = self.scores(self.decode(decoder_input_ids, memory), memory)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = self.criterion(logits.flatten(0, 1), targets.flatten(), smoothed=self.training)
        return Seq2SeqOutput(logits, loss)

    def next_token_logits(self, tokens: torch.Tensor, memory: Memory, cache: KVCache) -> torch.Tensor:
        """Scores (B, V) of the token after the last of `tokens` (B, T), which are appended to `cache`."""
        return self.scores(last_position(self.decode(tokens, memory, cache)), memory)[:, 0]

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty KV cache of the decoder's self-attention on this model's device and in its dtype (GPT's KVCache,
        which reads a config's layer count, width and heads)."""
        c, weight = self.config, self.shared.weight
        shape = SimpleNamespace(n_layer=c.decoder_layers, n_embd=c.d_model, n_head=c.n_head)
        return KVCache(shape, batch_size, max_len, device=weight.device, dtype=weight.dtype)

    def start_decoding(self, sources, max_new_tokens: int, num_rows: int):
        """The decoding state of the source token lists `sources` for models/generation.py, with room for num_rows
        rows (the beams) and max_new_tokens positions, and the first tokens to feed it (the decoder start token)."""
        input_ids, attention_mask = pad_sources(sources, self.config.pad_token_id, self.shared.weight.device)
        if input_ids.size(1) > self.config.max_positions or max_new_tokens > self.config.max_positions:
            raise ValueError(f"a source of {input_ids.size(1)} tokens or max_new_tokens={max_new_tokens} is more than "
                             f"the model's max_positions={self.config.max_positions}; shorten the source, or ask for "
                             "fewer tokens")
        state = TransformerDecoding(self, self.encode(input_ids, attention_mask),
                                    self.new_cache(max(num_rows, len(sources)), max(1, max_new_tokens)))
        return state, decoder_start(len(sources), self.config.decoder_start_token_id, input_ids.device)


def shift_right(targets: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """The decoder's inputs for `targets` (B, T): the start token, then the targets but the last (teacher forcing);
    IGNORE_INDEX (unscored padding) becomes pad_token_id. HF's shift_tokens_right."""
    inputs = targets.roll(1, dims=1)
    inputs[:, 0] = decoder_start_token_id
    return inputs.masked_fill(inputs == IGNORE_INDEX, pad_token_id)


# -----------------------------------------------------------------------------
# Loss


class LabelSmoothing(nn.Module):
    """Seed 000's LabelSmoothing criterion: the KL divergence KL(q || p) of the model's distribution p from the
    smoothed target q = (1 - eps) one_hot(y) + eps / V (Szegedy et al. 2016), averaged over the scored tokens (targets
    equal to ignore_index, the padding, are not). KL(q || p) = H(q, p) - H(q), so it is F.cross_entropy's
    label_smoothing=eps loss less the entropy of q, a constant: the same gradient, and 0 at p = q (tests/
    test_seq2seq.py). q spreads eps over every token, target and padding included, as F.cross_entropy does; seed 000
    spreads it over the V - 2 tokens that are neither. With eps = 0 it is the cross-entropy.

    Computed without materialising q: sum_v q_v log p_v = (1 - eps) log p_y + eps * mean_v log p_v."""

    def __init__(self, smoothing: float = 0.0, ignore_index: int = IGNORE_INDEX):
        super().__init__()
        self.smoothing, self.ignore_index = smoothing, ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor, smoothed: bool = True) -> torch.Tensor:
        """logits (N, V), target (N,) -> the mean loss over the scored tokens; `smoothed`=False: eps = 0."""
        eps = self.smoothing if smoothed else 0.0
        V = logits.size(-1)
        log_probs = logits.float().log_softmax(-1)  # (N, V)
        scored = target != self.ignore_index
        cross = (1.0 - eps) * log_probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (N,)
        if eps > 0.0:
            cross = cross + eps * log_probs.mean(-1)
        high, low = 1.0 - eps + eps / V, eps / V  # q's values at the target and elsewhere
        neg_entropy = high * math.log(high) + ((V - 1) * low * math.log(low) if low > 0 else 0.0)
        return (neg_entropy - cross).masked_fill(~scored, 0.0).sum() / scored.sum().clamp(min=1)


# -----------------------------------------------------------------------------
# Decoding: the state models/generation.py drives, and seed 000's greedy_decode


def pad_sources(sources, pad_token_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of source token ids -> right-padded ids (B, S) and attention_mask (B, S); one-line errors for what cannot
    be decoded."""
    if not sources:
        raise ValueError("sources is empty: give at least one source")
    if isinstance(sources[0], int):
        raise ValueError("sources is a list of sources, each a list of token ids: wrap a single source as [source]")
    if min(len(s) for s in sources) == 0:
        raise ValueError("a source is empty: give at least one token")
    S = max(len(s) for s in sources)
    ids = torch.tensor([list(s) + [pad_token_id] * (S - len(s)) for s in sources], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (S - len(s)) for s in sources], device=device)
    return ids, mask


def decoder_start(batch_size: int, decoder_start_token_id: int, device=None) -> torch.Tensor:
    return torch.full((batch_size, 1), decoder_start_token_id, device=device)  # (B, 1)


class TransformerDecoding:
    """A batch of targets being decoded from their sources' Memory with the decoder's KV cache (the Decoding of
    models/generation.py)."""

    def __init__(self, model: EncoderDecoder, memory: Memory, cache: KVCache):
        self.model, self.memory, self.cache = model, memory, cache
        self.eos_token_id = model.config.eos_token_id

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.next_token_logits(tokens, self.memory, self.cache)

    def reorder(self, rows: torch.Tensor) -> None:
        # the beams of one source share its Memory (Attention.cross), so only the decoder's own past moves
        self.cache.reorder(rows)


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor | None, max_len: int,
                  start_symbol: int) -> torch.Tensor:
    """Seed 000's greedy_decode: the most likely next token, max_len - 1 times, by running the decoder over the whole
    target so far at every step (no cache). src (B, S), src_mask (B, S) 1 = token -> (B, max_len) ids, starting with
    start_symbol. models/generation.py's greedy is the cached equivalent (and stops at the end token)."""
    memory = model.encode(src, src_mask)
    ys = decoder_start(src.size(0), start_symbol, src.device)
    for _ in range(max_len - 1):
        prob = model.scores(last_position(model.decode(ys, memory)), memory)[:, 0]  # (B, V)
        ys = torch.cat([ys, prob.argmax(-1, keepdim=True)], dim=1)
    return ys


# -----------------------------------------------------------------------------
# Checkpoint I/O. Our format: config.json (Seq2SeqConfig fields + "format") and model.safetensors (the state dict).

CHECKPOINT_FORMAT = "textrep-seq2seq"


def save_pretrained(model: EncoderDecoder, path) -> None:
    """Write `model` to directory `path` in our format (readable back with load_pretrained)."""
    save_checkpoint(model, path, CHECKPOINT_FORMAT)


def load_pretrained(path) -> EncoderDecoder:
    """Load a model written by save_pretrained."""
    return load_checkpoint(Path(path), EncoderDecoder, Seq2SeqConfig, CHECKPOINT_FORMAT)
