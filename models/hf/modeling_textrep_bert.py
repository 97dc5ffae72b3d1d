"""BERT as textrep trains it, for transformers: AutoModel and AutoModelForMaskedLM with trust_remote_code=True.

This file is copied beside the weights of every exported textrep BERT that transformers' own BertModel cannot compute
(fixed sinusoidal or Shaw et al. 2018 relative positions, pre-LayerNorm blocks), and imports only torch and
transformers, so the directory works without textrep installed. The computation is textrep's models/bert.py, written
out plainly (no packed tokens, no fused kernels); textrep's tests load every exported variant through the Auto classes
in a fresh process and compare its outputs with textrep's own model. Parameter names are BertModel's, so a
BertForMaskedLM-layout checkpoint (`bert.` + `cls.predictions.`) loads into either class here.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling, MaskedLMOutput


class TextrepBertConfig(PretrainedConfig):
    model_type = "textrep_bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    # "learned" (BERT's table), "sinusoidal" (Vaswani et al. 2017, fixed, scaled to the word embeddings' spread) or
    # "relative" (Shaw et al. 2018: key and value vectors per clipped distance, in every attention layer)
    position_embedding_type: str = "learned"
    max_relative_position: int = 16
    pre_layer_norm: bool = False  # True: LayerNorm on each sublayer's input, and once after the last layer


def sinusoidal_positions(length: int, dim: int, scale: float) -> torch.Tensor:
    """Vaswani et al. 2017, Sec. 3.5, computed in float64 as textrep does, times `scale`: (length, dim)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    angles = position * 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.float() * scale


class TextrepBertEmbeddings(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        c, T = self.config, input_ids.size(1)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        if c.position_embedding_type == "learned":
            x = x + self.position_embeddings(torch.arange(T, device=input_ids.device))
        elif c.position_embedding_type == "sinusoidal":
            # a function of the position, not a parameter: rebuilt here rather than kept as a buffer
            x = x + sinusoidal_positions(T, c.hidden_size, c.initializer_range * math.sqrt(2)).to(x)
        return self.dropout(self.LayerNorm(x))


class TextrepBertSelfAttention(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.relative = config.position_embedding_type == "relative"
        if self.relative:
            self.max_relative_position = config.max_relative_position
            self.relative_key = nn.Embedding(2 * config.max_relative_position + 1, self.head_size)
            self.relative_value = nn.Embedding(2 * config.max_relative_position + 1, self.head_size)

    def forward(self, hidden_states, additive_mask):
        B, T, H = hidden_states.shape
        q, k, v = (layer(hidden_states).view(B, T, self.num_heads, self.head_size).transpose(1, 2)
                   for layer in (self.query, self.key, self.value))  # (B, nh, T, hs)
        scores = q @ k.transpose(-2, -1)
        if self.relative:
            # clip(j - i, -k, k) + k: the relative embedding of query i and key j (Shaw et al. eq. 5)
            pos = torch.arange(T, device=hidden_states.device)
            index = (pos[None, :] - pos[:, None]).clamp(-self.max_relative_position, self.max_relative_position)
            index = (index + self.max_relative_position).expand(B, self.num_heads, T, T)
            scores = scores + (q @ self.relative_key.weight.t()).gather(-1, index)  # + q_i . a^K_ij (eq. 4)
        probs = self.dropout((scores * self.head_size**-0.5 + additive_mask).softmax(dim=-1))  # (B, nh, T, T)
        context = probs @ v
        if self.relative:  # + sum_j alpha_ij a^V_ij (eq. 3), the probabilities summed per clipped distance first
            per_distance = probs.new_zeros(B, self.num_heads, T, self.relative_value.num_embeddings)
            context = context + per_distance.scatter_add_(-1, index, probs) @ self.relative_value.weight
        return context.transpose(1, 2).reshape(B, T, H), probs


class TextrepBertSublayerOutput(nn.Module):
    """Projection, dropout, residual add; post-LN normalises the sum, pre-LN normalised the sublayer's input."""

    def __init__(self, config: TextrepBertConfig, width: int):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.dense = nn.Linear(width, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, residual):
        out = residual + self.dropout(self.dense(hidden_states))
        return out if self.pre_layer_norm else self.LayerNorm(out)


class TextrepBertAttention(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.self = TextrepBertSelfAttention(config)
        self.output = TextrepBertSublayerOutput(config, config.hidden_size)

    def forward(self, hidden_states, additive_mask):
        x = self.output.LayerNorm(hidden_states) if self.pre_layer_norm else hidden_states
        context, probs = self.self(x, additive_mask)
        return self.output(context, hidden_states), probs


class TextrepBertIntermediate(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states):
        return F.gelu(self.dense(hidden_states))  # exact (erf) GELU, as BERT


class TextrepBertLayer(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.attention = TextrepBertAttention(config)
        self.intermediate = TextrepBertIntermediate(config)
        self.output = TextrepBertSublayerOutput(config, config.intermediate_size)

    def forward(self, hidden_states, additive_mask):
        attention_output, probs = self.attention(hidden_states, additive_mask)
        x = self.output.LayerNorm(attention_output) if self.pre_layer_norm else attention_output
        return self.output(self.intermediate(x), attention_output), probs


class TextrepBertEncoder(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.layer = nn.ModuleList(TextrepBertLayer(config) for _ in range(config.num_hidden_layers))
        # pre-LN blocks never normalise the residual stream: one LayerNorm after the last
        self.LayerNorm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_layer_norm
                          else nn.Identity())


class TextrepBertPooler(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))


class TextrepBertPreTrainedModel(PreTrainedModel):
    config_class = TextrepBertConfig
    base_model_prefix = "bert"

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, TextrepBertLMHead):
            module.bias.data.zero_()


class TextrepBertModel(TextrepBertPreTrainedModel):
    """Returns the final token states, zero at padding as textrep's model gives them, and the pooled [CLS] state;
    with output_hidden_states the embeddings' and every layer's output, with output_attentions every layer's
    attention probabilities."""

    def __init__(self, config: TextrepBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = TextrepBertEmbeddings(config)
        self.encoder = TextrepBertEncoder(config)
        self.pooler = TextrepBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden_states = self.embeddings(input_ids, token_type_ids)
        keep = attention_mask[:, None, None, :].to(hidden_states.dtype)  # (B, 1, 1, T), over heads and queries
        additive_mask = (1.0 - keep) * torch.finfo(hidden_states.dtype).min
        all_hidden, all_probs = [hidden_states], []
        for layer in self.encoder.layer:
            hidden_states, probs = layer(hidden_states, additive_mask)
            all_hidden.append(hidden_states)
            all_probs.append(probs)
        sequence_output = self.encoder.LayerNorm(hidden_states) * attention_mask[..., None].to(hidden_states.dtype)
        all_hidden[-1] = sequence_output
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=self.pooler(sequence_output) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_probs) if output_attentions else None)


class TextrepBertPredictionHeadTransform(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(F.gelu(self.dense(hidden_states)))


class TextrepBertLMHead(nn.Module):
    """The transform, then scores against the word-embedding matrix (tied, as in BERT) plus a bias of their own."""

    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.transform = TextrepBertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states, word_embeddings):
        return F.linear(self.transform(hidden_states), word_embeddings) + self.bias


class TextrepBertOnlyMLMHead(nn.Module):
    def __init__(self, config: TextrepBertConfig):
        super().__init__()
        self.predictions = TextrepBertLMHead(config)


class TextrepBertForMaskedLM(TextrepBertPreTrainedModel):
    """The encoder and its masked-LM head: logits (B, T, vocab_size) over the pretraining vocabulary (rounded up to a
    multiple of 64; the rows past the tokenizer's are never predicted in pretraining)."""

    def __init__(self, config: TextrepBertConfig):
        super().__init__(config)
        self.bert = TextrepBertModel(config, add_pooling_layer=False)
        self.cls = TextrepBertOnlyMLMHead(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.bert.embeddings.word_embeddings

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions, output_hidden_states)
        logits = self.cls.predictions(out.last_hidden_state, self.bert.embeddings.word_embeddings.weight)
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
