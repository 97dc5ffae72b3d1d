"""
BERT (Devlin et al. 2018, https://arxiv.org/abs/1810.04805) in one file of plain PyTorch.

Read top to bottom: config -> embeddings -> attention -> layer -> encoder -> BertModel -> task heads ->
checkpoint I/O in our own format (HuggingFace BERT checkpoints, both ways: models/hf/bert.py).

Module and parameter names follow HuggingFace's `transformers.BertModel` exactly
(`encoder.layer.0.attention.self.query`, `LayerNorm`, ...), so converting weights is a matter of renaming almost
nothing. Beyond the original model we support two other position schemes (fixed sinusoids, Shaw et al. relative
positions) and pre-LayerNorm blocks.

This file is the model as the papers write it. The speed work (a cheaper CPU dropout mask, one matmul for q/k/v, layers
that skip the padding, a hand-written gradient of the tied word embeddings) lives in models/kernels.py, whose
use_fast_kernels(model) swaps its modules into a built model from outside: the pipeline does, where it builds a model
to train or run (trainer.fast_kernels); a model built here is the plain one.
"""

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.checkpoint import config_from_dict, load_checkpoint, save_checkpoint

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "relative")


@dataclass
class BertConfig:
    vocab_size: int = 30522  # BERT's uncased WordPiece vocabulary
    hidden_size: int = 768  # H; defaults are BERT-base
    num_hidden_layers: int = 12  # L
    num_attention_heads: int = 12  # A; head size is H / A
    intermediate_size: int = 3072  # feed-forward width, 4H in the paper
    max_position_embeddings: int = 512  # longest sequence for learned/sinusoidal positions
    type_vocab_size: int = 2  # segment A / segment B, for next sentence prediction and sentence-pair tasks
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12  # TF BERT's value; HF checkpoints rely on it for exact parity
    initializer_range: float = 0.02  # std of the normal init of every weight matrix and embedding
    # Id of [PAD]. Used by data collators and written to HF configs; not an nn.Embedding padding_idx: as in Google's
    # BERT, [PAD] has an ordinary embedding row and the attention mask is what keeps padding out of the model.
    pad_token_id: int = 0
    # "learned": BERT's trained absolute table; "sinusoidal": Vaswani et al. 2017's fixed table (no parameters);
    # "relative": Shaw et al. 2018 relative position representations inside every attention layer.
    position_embedding_type: str = "learned"
    max_relative_position: int = 16  # Shaw et al.'s clipping distance k; they found no gain beyond k = 16
    # False: post-LN, LayerNorm after each residual add (original BERT). True: pre-LN, LayerNorm on each sublayer's
    # input (Annotated Transformer; Xiong et al. 2020 show it trains stably without learning-rate warm-up).
    pre_layer_norm: bool = False

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(f"position_embedding_type must be one of {POSITION_EMBEDDING_TYPES}, "
                             f"got {self.position_embedding_type!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        return config_from_dict(cls, d)


# Named sizes: BERT-base from the paper, the smaller ones from Turc et al. 2019 ("Well-Read Students Learn Better").
BERT_SIZES: dict[str, dict] = {
    "bert_tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "bert_mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "bert_small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert_medium": dict(num_hidden_layers=8, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert_base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}


def bert_config(name: str, **overrides) -> BertConfig:
    """The named size from BERT_SIZES, with any BertConfig field overridden, e.g.
    bert_config("bert_tiny", vocab_size=8000)."""
    if name not in BERT_SIZES:
        raise KeyError(f"unknown BERT size {name!r}; known: {sorted(BERT_SIZES)}")
    return BertConfig(**{**BERT_SIZES[name], **overrides})


# -----------------------------------------------------------------------------
# Embeddings


def sinusoidal_position_table(num_positions: int, dim: int) -> torch.Tensor:
    """Vaswani et al. 2017, Sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    # float64 because pos * frequency reaches ~500 radians, where float32 arguments would already be off by ~3e-5
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    frequency = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (ceil(d/2),)
    angles = position * frequency  # (P, ceil(d/2))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.float()


class BertEmbeddings(nn.Module):
    """Token + segment (+ absolute position) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.position_embedding_type = config.position_embedding_type
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        elif config.position_embedding_type == "sinusoidal":
            # A fixed function of the position, so not a parameter and not saved: rebuilt from the config on load.
            # Scaled to the word embeddings' spread (sin/cos entries have std 1/sqrt(2), the embeddings
            # initializer_range): added unscaled, the table is ~35x the words at BERT's init, the embedding
            # LayerNorm keeps little but the position, and MLM stays at the unigram loss
            # (tests/bert/test_bert_model.py).
            # Vaswani et al. scale the words up by sqrt(d) instead, for embeddings initialised at std d^-1/2.
            table = sinusoidal_position_table(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("position_table", table * (config.initializer_range * math.sqrt(2)),
                                 persistent=False)
        # "relative" adds no absolute position here: each attention layer sees relative distances instead.
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.size(1)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, T, H)
        if self.position_embedding_type == "learned":
            x = x + self.position_embeddings(torch.arange(T, device=input_ids.device))  # (T, H), broadcast over B
        elif self.position_embedding_type == "sinusoidal":
            x = x + self.position_table[:T]
        return self.dropout(self.LayerNorm(x))

# -----------------------------------------------------------------------------
# Attention


def relative_position_index(T: int, k: int, device=None) -> torch.Tensor:
    """(T, T) row index into the 2k+1 relative embeddings: clip(j - i, -k, k) + k for query i, key j
    (Shaw et al. eq. 5)."""
    pos = torch.arange(T, device=device)
    return (pos[None, :] - pos[:, None]).clamp(-k, k) + k


def relative_attention_scores(q: torch.Tensor, w_k: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """q_i . a^K_ij for all i, j: q (B, nh, T, hs), w_k (2k+1, hs) the relative key embeddings, index (T, T) from
    relative_position_index -> (B, nh, T, T).

    Shaw et al. 2018, Sec. 3.3: a^K_ij is one of only 2k+1 vectors, shared across heads and batch, so each query is
    scored against those once (one (B nh T, hs) x (hs, 2k+1) matmul) and the (T, T) scores gathered from them, instead
    of T small matmuls against a materialised (T, T, hs) table (a third of a bert_tiny step on a CPU).
    """
    per_distance = q @ w_k.t()  # (B, nh, T, 2k+1)
    return per_distance.gather(-1, index.expand(*q.shape[:2], -1, -1))  # (B, nh, T, T)


def relative_attention_values(probs: torch.Tensor, w_v: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """sum_j alpha_ij a^V_ij for all i: probs (B, nh, T, T), w_v (2k+1, hs), index (T, T) -> (B, nh, T, hs). The
    probabilities are first summed per clipped distance (all keys beyond k share a^V), then one matmul with w_v."""
    per_distance = probs.new_zeros(*probs.shape[:3], w_v.size(0))  # (B, nh, T, 2k+1)
    per_distance.scatter_add_(-1, index.expand(*probs.shape[:2], -1, -1), probs)
    return per_distance @ w_v  # (B, nh, T, hs)


def additive_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T), 1 = token, 0 = padding -> (B, 1, 1, T) added to the attention scores: 0 for tokens, the most negative
    float for padding keys, broadcast over heads and queries. finfo.min rather than -inf keeps fully padded rows finite
    instead of NaN."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017), optionally with Shaw et al. relative positions."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        # Separate q/k/v projections, as in HF, so checkpoints convert key for key.
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.relative = config.position_embedding_type == "relative"
        if self.relative:
            # Shaw et al. 2018: one learned vector per clipped distance -k..k for keys and one for values, of head
            # size, shared across heads, separate in every layer.
            self.max_relative_position = config.max_relative_position
            self.relative_key = nn.Embedding(2 * config.max_relative_position + 1, self.attention_head_size)
            self.relative_value = nn.Embedding(2 * config.max_relative_position + 1, self.attention_head_size)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        """hidden_states (B, T, H); attention_mask additive, broadcastable to (B, nh, T, T), or None. Returns the
        context (B, T, H) and the attention probabilities (B, nh, T, T), or None when not computed."""
        B, T, H = hidden_states.shape
        nh, hs = self.num_attention_heads, self.attention_head_size
        q, k, v = (proj(hidden_states).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
                   for proj in (self.query, self.key, self.value))
        context, probs = self.attend(q, k, v, attention_mask, with_probs=output_attentions)
        return context.transpose(1, 2).reshape(B, T, H), probs

    def attend(self, q, k, v, attention_mask, with_probs: bool):
        """softmax(q k^T / sqrt(hs) + mask) v over q, k, v (B, nh, T, hs), with dropout on the probabilities: returns
        the context (B, nh, T, hs) and the probabilities (B, nh, T, T), or None when with_probs is false and SDPA's
        fused kernel (flash / memory-efficient) computed the context without them."""
        T, hs = q.size(2), self.attention_head_size
        dropout_p = self.dropout.p if self.training else 0.0
        if not (self.relative or with_probs):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout_p), None
        # Explicit softmax: relative positions need alpha for the value term, heat-maps need alpha itself.
        scores = (q @ k.transpose(-2, -1)) * hs**-0.5  # (B, nh, T, T)
        if self.relative:
            index = relative_position_index(T, self.max_relative_position, q.device)  # (T, T)
            # e_ij = (q_i . k_j + q_i . a^K_ij) / sqrt(hs)   (Shaw et al. eq. 4)
            scores = scores + relative_attention_scores(q, self.relative_key.weight, index) * hs**-0.5
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(dim=-1)
        dropped = self.dropout(probs)
        context = dropped @ v  # (B, nh, T, hs)
        if self.relative:
            # z_i = sum_j alpha_ij (v_j + a^V_ij)   (Shaw et al. eq. 3)
            context = context + relative_attention_values(dropped, self.relative_value.weight, index)
        return context, probs


class BertSelfOutput(nn.Module):
    """Output projection of attention, dropout, residual add; post-LN also normalises the sum."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        if self.pre_layer_norm:
            return input_tensor + hidden_states  # this LayerNorm was applied to the sublayer input (BertAttention)
        return self.LayerNorm(input_tensor + hidden_states)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        # Pre-LN normalises what goes into attention and leaves the residual stream un-normalised. The LayerNorm keeps
        # its post-LN name (attention.output.LayerNorm) so both variants share one parameter layout.
        x = self.output.LayerNorm(hidden_states) if self.pre_layer_norm else hidden_states
        context, probs = self.self(x, attention_mask, output_attentions)
        return self.output(context, hidden_states), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states):
        # exact (erf) GELU, Hendrycks & Gimpel 2016, as in BERT and HF's hidden_act="gelu"
        return F.gelu(self.dense(hidden_states))


class BertOutput(nn.Module):
    """Feed-forward down-projection, dropout, residual add; post-LN also normalises the sum."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        if self.pre_layer_norm:
            return input_tensor + hidden_states  # this LayerNorm was applied to the sublayer input (BertLayer)
        return self.LayerNorm(input_tensor + hidden_states)


class BertLayer(nn.Module):
    """One Transformer encoder block: self-attention sublayer, then feed-forward sublayer."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        attention_output, probs = self.attention(hidden_states, attention_mask, output_attentions)
        x = self.output.LayerNorm(attention_output) if self.pre_layer_norm else attention_output
        return self.output(self.intermediate(x), attention_output), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])
        # Pre-LN blocks never normalise the residual stream itself, so it gets one LayerNorm at the very end.
        self.LayerNorm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_layer_norm
                          else nn.Identity())

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        """hidden_states (B, T, H), the embedded tokens; attention_mask (B, T), 1 = token, 0 = padding. Returns the
        final states (B, T, H), zero at the padding, and each layer's attention probabilities (or None)."""
        if attention_mask is None:
            return self.run_layers(hidden_states, None, output_attentions)
        additive = additive_attention_mask(attention_mask, hidden_states.dtype)
        hidden_states, all_probs = self.run_layers(hidden_states, additive, output_attentions)
        return hidden_states.masked_fill(attention_mask[:, :, None] == 0, 0.0), all_probs

    def run_layers(self, hidden_states, attention_mask, output_attentions):
        all_probs = []
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, attention_mask, output_attentions)
            all_probs.append(probs)
        return self.LayerNorm(hidden_states), all_probs


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation that next sentence prediction and classifiers read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))  # (B, H)


# -----------------------------------------------------------------------------
# Models


class BertPreTrainedModel(nn.Module):
    """Holds the config and BERT's weight initialisation, shared by the encoder and every task model."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self):
        self.apply(self._init_weights)

    @torch.no_grad()
    def _init_weights(self, module):
        # Google's BERT: every weight matrix and embedding ~ N(0, 0.02) (truncated there; plain normal here, as in HF),
        # biases zero, LayerNorm the identity.
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, BertLMPredictionHead):
            module.bias.zero_()


class BertModel(BertPreTrainedModel):
    """The encoder: embeddings -> L Transformer layers -> pooler. Task models wrap it as `.bert`."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, output_attentions=False):
        """input_ids (B, T); token_type_ids (B, T), default all segment 0; attention_mask (B, T), 1 = token, 0 = pad.

        Returns (sequence_output (B, T, H), pooled_output (B, H)), plus a list of per-layer attention probabilities
        (B, nh, T, T) as a third element when output_attentions=True. sequence_output is zero at padded positions.
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden_states = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        sequence_output, all_probs = self.encoder(hidden_states, attention_mask, output_attentions)
        pooled_output = self.pooler(sequence_output)
        if output_attentions:
            return sequence_output, pooled_output, all_probs
        return sequence_output, pooled_output


# -----------------------------------------------------------------------------
# Pretraining heads


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(F.gelu(self.dense(hidden_states)))


class BertLMPredictionHead(nn.Module):
    """Masked-LM head: transform, then scores over the vocabulary with the input embedding matrix as output weights."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # Tied weights (Press & Wolf 2017, as in BERT): the decoder's weight IS the word embedding Parameter.
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # output-only bias, not tied

    def forward(self, hidden_states):
        return self.decoder(self.transform(hidden_states)) + self.bias


class BertPreTrainingHeads(nn.Module):
    """Masked-LM head on the token states and next-sentence-prediction head on the pooled [CLS] state."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


class BertPretrainingModel(BertPreTrainedModel):
    """An encoder `.bert` under pretraining heads whose MLM decoder is tied to its word embeddings: what the heads file
    of a finished phase holds, and how a later phase continues from it."""
    # The decoder's weight is the word embedding matrix itself (one Parameter under two names), saved with the encoder.
    TIED_DECODER: str

    def heads_state_dict(self) -> dict[str, torch.Tensor]:
        """The heads' tensors without the tied decoder weight, on the CPU: with the encoder's checkpoint, everything
        a later phase needs to continue pretraining (see load_encoder_and_heads)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()
                if not k.startswith("bert.") and k != self.TIED_DECODER}

    def load_encoder_and_heads(self, encoder: BertModel, heads: dict[str, torch.Tensor]) -> None:
        """Continue from a finished phase: `encoder` of the same configuration and `heads` from heads_state_dict.
        Strict: a missing or extra tensor is an error."""
        state = {f"bert.{k}": v for k, v in encoder.state_dict().items()}
        state[self.TIED_DECODER] = state["bert.embeddings.word_embeddings.weight"]
        self.load_state_dict({**state, **heads})


class BertForPreTraining(BertPretrainingModel):
    TIED_DECODER = "cls.predictions.decoder.weight"

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        # Only the heads: .bert initialised itself. (The tied decoder redraws the word embeddings from the same
        # N(0, std).)
        self.cls.apply(self._init_weights)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None):
        """Returns (mlm_logits, nsp_logits (B, 2)). mlm_logits is (B, T, V), or (B, P, V) for mlm_positions (B, P).

        mlm_positions are the indices of the masked tokens (pad the ragged lists with any index and ignore those
        predictions in the loss). Only ~15% of tokens are masked, so gathering them before the vocabulary projection
        skips most of the largest matmul in the model (NVIDIA's DeepLearningExamples BERT does the same).
        """
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        if mlm_positions is not None:
            index = mlm_positions.unsqueeze(-1).expand(-1, -1, sequence_output.size(-1))  # (B, P, H)
            sequence_output = sequence_output.gather(1, index)  # (B, P, H)
        return self.cls(sequence_output, pooled_output)


class BertTaskModel(BertPreTrainedModel):
    """A task head on a BertModel (`.bert`, HuggingFace's name, so HF task checkpoints load): subclasses add it."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)

    @property
    def encoder(self) -> BertModel:
        """The pretrained encoder under the head, whatever the family calls it: what fine-tuning may train at its
        own learning rate and what a pretrained checkpoint is loaded into."""
        return self.bert


SEQUENCE_POOLINGS = ("cls", "mean")


class BertForSequenceClassification(BertTaskModel):
    """Classifier on the pooled [CLS] state (BERT), or on the mean of the final token states ("mean", as Sentence-BERT
    pools); num_labels=1 makes it a regressor (e.g. STS-B). Mean pooling reads what masked-LM pretraining trains,
    every token's state; the [CLS] state and its pooler are trained by next sentence prediction alone, so an encoder
    whose NSP learned little hands a classifier an untrained summary."""

    def __init__(self, config: BertConfig, num_labels: int, pooling: str = "cls"):
        if pooling not in SEQUENCE_POOLINGS:
            raise ValueError(f"pooling must be one of {SEQUENCE_POOLINGS}, got {pooling!r}")
        super().__init__(config)
        self.num_labels, self.pooling = num_labels, pooling
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.classifier.apply(self._init_weights)  # only the head: .bert is initialised (or about to be loaded)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        if self.pooling == "mean":
            mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).unsqueeze(-1)
            mask = mask.to(sequence_output.dtype)  # (B, T, 1)
            pooled_output = (sequence_output * mask).sum(1) / mask.sum(1)  # (B, H)
        return self.classifier(self.dropout(pooled_output))  # (B, num_labels)


class BertForPromptClassification(BertTaskModel):
    """Prompt-based classification (PET, Schick & Schütze 2021; LM-BFF, Gao et al. 2021): no new head. Each input
    holds a template with one [MASK] ("a [MASK] film . <sentence>"), and class c's score is the masked-LM head's logit
    of its label word there ("bad", "good"): the classifier starts where pretraining left the head, not from a random
    linear layer. Load the pretraining head's tensors with load_prediction_head; only the label words' rows of the
    tied decoder are ever multiplied."""

    def __init__(self, config: BertConfig, label_word_ids: list[int], mask_token_id: int):
        super().__init__(config)
        self.mask_token_id = mask_token_id
        self.register_buffer("label_word_ids", torch.tensor(label_word_ids, dtype=torch.long), persistent=False)
        self.predictions = BertLMPredictionHead(config, self.bert.embeddings.word_embeddings)
        self.predictions.transform.apply(self._init_weights)

    def load_prediction_head(self, heads: dict[str, torch.Tensor]) -> None:
        """The masked-LM head of a pretraining checkpoint (BertPretrainingModel.heads_state_dict's tensors)."""
        prefix = "cls.predictions."
        loaded = self.predictions.load_state_dict(
            {k.removeprefix(prefix): v for k, v in heads.items() if k.startswith(prefix)}, strict=False)
        missing = [name for name in loaded.missing_keys if name != "decoder.weight"]  # the tied, loaded embeddings
        if missing:
            raise KeyError(f"the pretraining heads lack the masked-LM head's {missing}")

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        at_mask = input_ids == self.mask_token_id  # (B, T), one [MASK] per row
        if not bool((at_mask.sum(1) == 1).all()):
            raise ValueError("every input of a prompt classifier holds its template's [MASK] exactly once")
        h = self.predictions.transform(sequence_output[at_mask])  # (B, H)
        words = self.label_word_ids
        return h @ self.predictions.decoder.weight[words].T + self.predictions.bias[words]  # (B, num_labels)


class BertForTokenClassification(BertTaskModel):
    """Per-token classifier (e.g. NER tags)."""

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__(config)
        self.num_labels = num_labels
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.classifier.apply(self._init_weights)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(sequence_output))  # (B, T, num_labels)


class BertForQuestionAnswering(BertTaskModel):
    """Extractive QA (SQuAD): a start and an end score per token, from one linear layer (BERT paper, Sec. 4.2)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.qa_outputs.apply(self._init_weights)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        start_logits, end_logits = self.qa_outputs(sequence_output).unbind(dim=-1)
        return start_logits, end_logits  # (B, T) each


# -----------------------------------------------------------------------------
# Checkpoint I/O. Our format: config.json (BertConfig fields + "format") and model.safetensors (BertModel state dict).

CHECKPOINT_FORMAT = "textrep-bert"


def save_pretrained(model: BertModel, path) -> None:
    """Write the encoder to directory `path` in our format (readable back with load_pretrained)."""
    save_checkpoint(model, path, CHECKPOINT_FORMAT)


def load_pretrained(path) -> BertModel:
    """Load an encoder written by save_pretrained (models.hf.bert.load_ours_or_hf reads HuggingFace directories too)."""
    return load_checkpoint(Path(path), BertModel, BertConfig, CHECKPOINT_FORMAT)
