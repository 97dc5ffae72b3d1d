"""textrep's Transformer encoder-decoder (seed 000's, Vaswani et al. 2017) where HuggingFace's BART cannot compute it
(pre-LN blocks, sinusoidal positions, copy attention), for transformers: AutoModelForSeq2SeqLM with
trust_remote_code=True.

This file is copied beside the weights of every such exported model and imports only torch and transformers, so the
directory works without textrep installed. The computation is textrep's models/seq2seq.py written out plainly, with
its parameter names (BART's); textrep's tests compare the logits of a loaded directory with its own. With
copy_attention, See et al. 2017's pointer-generator mixes copying from the source into the output
(TextrepPointerGenerator).

Inputs: the source ids of its tokenizer followed by the end token, as the model was trained (right padding, told by
the attention mask), and the decoder's input, which starts with decoder_start_token_id. Outputs: the logits of the
next target token at each decoder position (with copy_attention, the mixture's log-probabilities, their own
log_softmax). `generate` decodes (greedy, sampling or beam search) by running the decoder over the whole prefix at
every step: the model keeps no cache.
"""
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import ModelOutput

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TextrepSeq2SeqConfig(PretrainedConfig):
    model_type = "textrep_seq2seq"

    def __init__(self, vocab_size=32000, d_model=512, encoder_layers=6, decoder_layers=6, n_head=8, d_ff=2048,
                 max_positions=512, activation="relu", position_embedding_type="sinusoidal",
                 learned_position_offset=0, pre_layer_norm=True, layernorm_embedding=False, scale_embedding=True,
                 layer_norm_eps=1e-5, copy_attention=False, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2,
                 **kwargs):
        self.vocab_size, self.d_model, self.n_head, self.d_ff = vocab_size, d_model, n_head, d_ff
        self.encoder_layers, self.decoder_layers, self.max_positions = encoder_layers, decoder_layers, max_positions
        self.activation, self.position_embedding_type = activation, position_embedding_type
        self.learned_position_offset, self.pre_layer_norm = learned_position_offset, pre_layer_norm
        self.layernorm_embedding, self.scale_embedding = layernorm_embedding, scale_embedding
        self.layer_norm_eps, self.copy_attention = layer_norm_eps, copy_attention
        super().__init__(pad_token_id=pad_token_id, decoder_start_token_id=decoder_start_token_id,
                         eos_token_id=eos_token_id, **{**kwargs, "is_encoder_decoder": True})


def sinusoidal_positions(num_positions, dim):
    """Vaswani et al. Sec. 3.5, computed in float64 as textrep does."""
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    angles = position * 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angles), torch.cos(angles[:, : dim // 2])
    return table.float()


class TextrepAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config.d_model
        self.n_head = config.n_head
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def heads(self, x):
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x, memory, mask):
        """x (B, T, d) attends over memory (B, S, d) where the boolean mask (True = may attend) allows."""
        y = F.scaled_dot_product_attention(self.heads(self.q_proj(x)), self.heads(self.k_proj(memory)),
                                           self.heads(self.v_proj(memory)), attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).flatten(2))

    def probabilities(self, x, memory, mask):
        """forward's attention probabilities averaged over heads (B, T, S), zero where the mask is False: what the
        pointer-generator copies by (SDPA does not return them, so they are recomputed)."""
        q, k = self.heads(self.q_proj(x)), self.heads(self.k_proj(memory))
        scores = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1).mean(1)


class TextrepLayer(nn.Module):
    """An encoder layer, or with cross-attention a decoder layer; pre- or post-LN around each sublayer."""

    def __init__(self, config, cross):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.pre_layer_norm, self.activation = config.pre_layer_norm, ACTIVATIONS[config.activation]
        self.self_attn, self.self_attn_layer_norm = TextrepAttention(config), nn.LayerNorm(d, eps=eps)
        if cross:
            self.encoder_attn, self.encoder_attn_layer_norm = TextrepAttention(config), nn.LayerNorm(d, eps=eps)
        self.fc1, self.fc2 = nn.Linear(d, config.d_ff), nn.Linear(config.d_ff, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=eps)

    def sublayer_input(self, x, norm):
        return norm(x) if self.pre_layer_norm else x

    def residual(self, x, y, norm):
        return x + y if self.pre_layer_norm else norm(x + y)

    def sublayer(self, x, norm, fn):
        return self.residual(x, fn(self.sublayer_input(x, norm)), norm)

    def forward(self, x, mask, memory=None, memory_mask=None):
        """x -> the layer's output and, in a decoder layer, its attention over the memory: the query's input and the
        output (the context), which the pointer-generator reads of the last layer; None and None in an encoder
        layer."""
        x = self.sublayer(x, self.self_attn_layer_norm, lambda h: self.self_attn(h, h, mask))
        query = context = None
        if memory is not None:
            query = self.sublayer_input(x, self.encoder_attn_layer_norm)
            context = self.encoder_attn(query, memory, memory_mask)
            x = self.residual(x, context, self.encoder_attn_layer_norm)
        x = self.sublayer(x, self.final_layer_norm, lambda h: self.fc2(self.activation(self.fc1(h))))
        return x, query, context


class TextrepStackOutput(NamedTuple):
    states: torch.Tensor  # (B, T, d): the final states
    inputs: torch.Tensor  # (B, T, d): the embedded tokens, the first layer's input
    query: torch.Tensor | None  # (B, T, d): the input of the last layer's attention over the memory (decoder only)
    context: torch.Tensor | None  # (B, T, d): that attention's output (decoder only)


class TextrepStack(nn.Module):
    main_input_name = "input_ids"  # what `generate` asks of a model's `encoder`

    def __init__(self, config, num_layers, cross):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.offset = config.learned_position_offset
        if config.position_embedding_type == "learned":
            self.embed_positions = nn.Embedding(config.max_positions + self.offset, d)
        self.layernorm_embedding = nn.LayerNorm(d, eps=eps) if config.layernorm_embedding else nn.Identity()
        self.layers = nn.ModuleList(TextrepLayer(config, cross) for _ in range(num_layers))
        self.layer_norm = nn.LayerNorm(d, eps=eps) if config.pre_layer_norm else nn.Identity()

    def forward(self, embedded, mask, memory=None, memory_mask=None):
        T = embedded.size(1)
        # sinusoids: a function of the position, not a parameter, rebuilt here rather than kept as a buffer
        positions = (self.embed_positions.weight[self.offset: self.offset + T] if hasattr(self, "embed_positions")
                     else sinusoidal_positions(T, embedded.size(2)).to(embedded))
        x = inputs = self.layernorm_embedding(embedded * self.embed_scale + positions)
        for layer in self.layers:
            x, query, context = layer(x, mask, memory, memory_mask)
        return TextrepStackOutput(self.layer_norm(x), inputs, query, context)


def key_mask(attention_mask):
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


class TextrepPointerGenerator(nn.Module):
    """See et al. 2017's pointer-generator over the vocabulary that source and target share: a gate
    p_gen = sigmoid(w . features + b) mixes the vocabulary distribution with the attention over the source scattered
    onto the source's ids, P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{s: x_s = w} a_s (a repeated token gets each of
    its shares; padding has zero attention, so none)."""

    def __init__(self, width):
        super().__init__()
        self.p_gen = nn.Linear(width, 1)

    def forward(self, logits, features, attention, source_ids):
        """logits (B, T, V), features (B, T, width), attention (B, T, S) over source_ids (B, S) -> log P (B, T, V) in
        fp32, the logaddexp of the two terms' logs, so the vocabulary's term never underflows to log 0."""
        gate = self.p_gen(features).float()  # (B, T, 1)
        copy = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_add_(
            -1, source_ids[:, None].expand(attention.shape), attention.float())
        log_copy = copy.clamp_min(torch.finfo(torch.float32).tiny).log()  # tokens outside the source: log 0, clamped
        return torch.logaddexp(F.logsigmoid(gate) + logits.float().log_softmax(-1), F.logsigmoid(-gate) + log_copy)


@dataclass
class TextrepSeq2SeqEncoderOutput(ModelOutput):
    """The encoder's states (B, S, d), and the source's ids (B, S), which the pointer-generator copies: kept here so
    that `generate` repeats them per beam as it does the states."""
    last_hidden_state: torch.Tensor = None
    source_ids: torch.Tensor = None


class TextrepSeq2SeqEncoder:
    """The source's ids -> the encoder's states: what `generate` runs once per source (get_encoder). Not a module of
    its own: the embeddings and the encoder stack are the model's, under textrep's names."""

    main_input_name = "input_ids"

    def __init__(self, model):
        self.model = model

    def forward(self, input_ids, attention_mask=None, **kwargs):
        model = self.model
        states = model.encoder(model.shared(input_ids), key_mask(attention_mask)).states
        return TextrepSeq2SeqEncoderOutput(last_hidden_state=states, source_ids=input_ids)

    __call__ = forward


def source_ids(encoder_outputs, input_ids):
    """The source's ids the pointer-generator copies: those get_encoder kept with the encoder's states, else
    input_ids."""
    ids = encoder_outputs.get("source_ids") if isinstance(encoder_outputs, ModelOutput) else None
    if ids is None:
        ids = input_ids
    if ids is None:
        raise ValueError("copy_attention copies from the source, so the model needs its ids: pass input_ids, or "
                         "encoder_outputs from this model's get_encoder(), which keeps them")
    return ids


class TextrepSeq2SeqForConditionalGeneration(PreTrainedModel, GenerationMixin):
    config_class = TextrepSeq2SeqConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = TextrepStack(config, config.encoder_layers, cross=False)
        self.decoder = TextrepStack(config, config.decoder_layers, cross=True)
        self.final_logits_bias = nn.Parameter(torch.zeros(config.vocab_size))
        if config.copy_attention:  # reads [context; decoder state; decoder input]
            self.pointer = TextrepPointerGenerator(3 * config.d_model)
        self.post_init()

    def get_encoder(self):
        return TextrepSeq2SeqEncoder(self)

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None, **kwargs):
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        memory, memory_mask = encoder_outputs[0], key_mask(attention_mask)
        T = decoder_input_ids.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=decoder_input_ids.device).tril()
        out = self.decoder(self.shared(decoder_input_ids), causal, memory, memory_mask)
        logits = F.linear(out.states, self.shared.weight, self.final_logits_bias)
        if self.config.copy_attention:
            # the last decoder layer's attention over the memory, averaged over heads, is what is copied by
            attention = self.decoder.layers[-1].encoder_attn.probabilities(out.query, memory, memory_mask)
            features = torch.cat([out.context, out.states, out.inputs], dim=-1)
            logits = self.pointer(logits, features, attention, source_ids(encoder_outputs, input_ids))
        return Seq2SeqLMOutput(logits=logits, encoder_last_hidden_state=memory)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # generate must not build a cache this model would not fill

    def prepare_inputs_for_generation(self, decoder_input_ids, encoder_outputs=None, attention_mask=None, **kwargs):
        # no cache: the decoder reads the whole prefix at every step; the source's ids travel in encoder_outputs
        return {"decoder_input_ids": decoder_input_ids, "encoder_outputs": encoder_outputs,
                "attention_mask": attention_mask}

