"""
GPT (Radford et al. 2018; GPT-2, Radford et al. 2019) in one file of plain PyTorch: a causal Transformer language model.

Read top to bottom: config -> KV cache -> attention -> MLP -> block -> GPTModel -> GPTLMHeadModel -> checkpoint I/O (our
own format; HuggingFace GPT-2 checkpoints, both ways: models/hf/gpt.py) -> GPT-1's fine-tuning head. Decoding
strategies live in models/generation.py.

The layout is GPT-2's as in nanoGPT and HuggingFace's `GPT2LMHeadModel` (`transformer.h.0.attn.c_attn`, `ln_1`,
`mlp.c_fc`, ...): pre-LN blocks, a final LayerNorm, the LM head tied to the token embeddings. HF stores its projections
as `Conv1D` with the weight transposed relative to nn.Linear, so converting weights (models/hf/gpt.py) is renaming plus
four transposes.

The speed work (a cheaper CPU dropout mask, a kernel of our own for the few-row products of a decoding step) lives in
models/kernels.py, whose use_fast_kernels(model) swaps it into a built model from outside (the pipeline does, where
it builds a model to train or run: trainer.fast_kernels).
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from conventions import GPT_POOLINGS
from models import IGNORE_INDEX
from models.checkpoint import load_checkpoint, save_checkpoint


@dataclass
class GPTConfig:
    vocab_size: int = 50257  # GPT-2's byte-level BPE: 256 bytes + 50000 merges + <|endoftext|>
    n_positions: int = 1024  # the context (block size): the learned position table's length; defaults are GPT-2 small
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12  # head size is n_embd / n_head
    # GPT-2's three dropout sites, named as in HF's GPT2Config so its configs convert field for field
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02  # std of the normal init; residual projections get it / sqrt(2 n_layer)
    # The end-of-document token the data stage puts between books (GPT-2's <|endoftext|>, 50256): generation stops
    # when it is produced. None: the vocabulary has none, and generation runs to max_new_tokens.
    eos_token_id: int | None = None
    # Label smoothing (Szegedy et al. 2016) of the loss in training mode; Vaswani et al. 2017 used 0.1 (the Annotated
    # Transformer's LabelSmoothing, seed 000). GPT-2 uses none, hence off. The eval-mode loss is never smoothed.
    label_smoothing: float = 0.0

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id {self.eos_token_id} is outside the vocabulary of {self.vocab_size}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


# Named sizes. gpt_tiny and gpt_mini have bert_tiny's and bert_mini's shapes (Turc et al. 2019), so BERT and GPT compare
# at equal size; gpt_small is GPT-2 small: 124,439,808 parameters with GPT-2's vocabulary and 1024 positions.
GPT_SIZES: dict[str, dict] = {
    "gpt_tiny": dict(n_layer=2, n_embd=128, n_head=2),
    "gpt_mini": dict(n_layer=4, n_embd=256, n_head=4),
    "gpt_small": dict(n_layer=12, n_embd=768, n_head=12),
}


def gpt_config(name: str, **overrides) -> GPTConfig:
    """The named size from GPT_SIZES with any GPTConfig field overridden: gpt_config("gpt_tiny", vocab_size=8000)."""
    if name not in GPT_SIZES:
        raise KeyError(f"unknown GPT size {name!r}; known: {sorted(GPT_SIZES)}")
    return GPTConfig(**{**GPT_SIZES[name], **overrides})


# -----------------------------------------------------------------------------
# KV cache


class KVCache:
    """The keys and values every layer has computed so far, so that decoding step t runs the model on one new token
    instead of all t. Preallocated to `max_len` positions: a step writes one column in place, where concatenating would
    copy the whole past again at every step.

    `pad` (B,) holds how many left-padding positions each row of a batch of unequal prompts starts with: those keys are
    hidden from every query, and positions count from each row's first real token, so a padded row decodes as it would
    alone.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, pad: torch.Tensor | None = None,
                 device=None, dtype=None):
        hs = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, max_len, hs)  # (L, B, nh, max_len, hs)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # Each layer's (B, nh, max_len, hs) view, made once: a decoding step appends to every layer, and indexing the
        # (L, ...) tensors anew each time costs more than the copy itself at one token
        self._layer_k = [self.k[layer] for layer in range(config.n_layer)]
        self._layer_v = [self.v[layer] for layer in range(config.n_layer)]
        self.max_len = max_len
        self.length = 0  # positions filled, the same in every row
        self.pad = pad

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's keys and values of the new positions, k and v (B, nh, T, hs); return all of the
        layer's so far, (B, nh, length + T, hs). The caller advances `length` once every layer has appended."""
        B, T, end = k.size(0), k.size(2), self.length + k.size(2)
        layer_k, layer_v = self._layer_k[layer], self._layer_v[layer]
        if B != layer_k.size(0):  # beam search's first step: one row, before the beams exist
            layer_k, layer_v = layer_k[:B], layer_v[:B]
        layer_k.narrow(2, self.length, T).copy_(k)
        layer_v.narrow(2, self.length, T).copy_(v)
        return layer_k.narrow(2, 0, end), layer_v.narrow(2, 0, end)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i becomes the old row rows[i] (beam search keeping, and duplicating, the surviving beams' pasts)."""
        n, end = rows.numel(), self.length
        self.k[:, :n, :, :end] = self.k[:, rows, :, :end]  # advanced indexing copies first, so overlap is safe
        self.v[:, :n, :, :end] = self.v[:, rows, :, :end]
        if self.pad is not None:
            self.pad = self.pad[rows]


def causal_mask(past: int, T: int, pad: torch.Tensor | None, device=None) -> torch.Tensor | None:
    """Boolean attention mask (True = may attend) for T new queries at positions past..past+T-1 over keys
    0..past+T-1: (T, past+T), or (B, 1, T, past+T) with left padding `pad` (B,). None where SDPA needs none: with no
    past, its is_causal is this mask (and faster); a single newest query may see every key."""
    if pad is None and (past == 0 or T == 1):
        return None
    query = past + torch.arange(T, device=device)[:, None]  # (T, 1)
    key = torch.arange(past + T, device=device)  # (S,)
    allowed = key <= query  # (T, S)
    if pad is None:
        return allowed
    # A padding query still sees itself, so no query is left without a key and the result never depends on what a
    # backend makes of one: a plain softmax gives NaN, which would reach the real tokens through the next layer's keys
    # and values (0 * NaN) even though they are masked.
    allowed = allowed & ((key >= pad[:, None, None]) | (key == query))  # (B, T, S)
    return allowed[:, None]  # (B, 1, T, S), broadcast over heads


# -----------------------------------------------------------------------------
# Blocks


class CausalSelfAttention(nn.Module):
    """Multi-head masked self-attention (Vaswani et al. 2017): each position attends to itself and the positions before
    it, through F.scaled_dot_product_attention (a fused kernel wherever one applies)."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.layer = config.n_head, layer
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul, GPT-2's layout
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_pdrop = config.attn_pdrop
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        if cache is not None:  # q, k, v (B, nh, T, hs)
            k, v = cache.append(self.layer, k, v)  # (B, nh, S, hs), S = past + T
        dropout_p = self.attn_pdrop if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                           is_causal=mask is None and T > 1)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's GELU is the tanh approximation (HF's "gelu_new"); the exact erf GELU would be off by up to ~1e-3
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LN decoder block (GPT-2, Sec. 2.3): x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache=None):
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


# -----------------------------------------------------------------------------
# Models


class GPTModel(nn.Module):
    """The decoder: token + learned position embeddings -> n_layer blocks -> final LayerNorm (GPT-2 added it: pre-LN
    blocks never normalise the residual stream itself). The LM wraps it as `.transformer`; a fine-tuning head reads its
    states."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """idx (B, T) token ids: the whole sequence, or with `cache` the T positions after those it holds (then
        appended to it). Returns the final states (B, T, n_embd)."""
        T = idx.size(1)
        past = 0 if cache is None else cache.length
        pad = None if cache is None else cache.pad
        if past + T > self.config.n_positions:
            raise ValueError(f"sequence of {past + T} tokens is longer than the context n_positions="
                             f"{self.config.n_positions}; feed at most {self.config.n_positions} positions")
        if cache is not None and past + T > cache.max_len:
            raise ValueError(f"the KV cache holds {cache.max_len} positions, {past + T} needed; allocate it longer")
        pos = torch.arange(past, past + T, device=idx.device)  # (T,)
        if pad is not None:
            pos = (pos - pad[:, None]).clamp(min=0)  # (B, T): each row counts from its first real token
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        mask = causal_mask(past, T, pad, idx.device)
        for block in self.h:
            x = block(x, mask, cache)
        if cache is not None:
            cache.length += T
        return self.ln_f(x)


class LMOutput(NamedTuple):
    logits: torch.Tensor  # (B, T, V): scores of the token after each position
    loss: torch.Tensor | None  # mean cross-entropy against `targets`, when given


class GPTLMHeadModel(nn.Module):
    """The causal language model: GPTModel, then scores over the vocabulary against the token embedding matrix itself
    (tied weights, Press & Wolf 2017, as in GPT-1 and GPT-2). The head is that matrix, not a module holding it, so the
    state dict (and HF's file) has one copy."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = GPTModel(config)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        # GPT-2 (as in HF and nanoGPT): weights and embeddings ~ N(0, 0.02), biases zero, LayerNorm the identity; the
        # two projections that write into the residual stream in each block ~ N(0, 0.02 / sqrt(2 n_layer)), so the
        # stream's variance does not grow with depth (GPT-2, Sec. 2.3).
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(mean=0.0, std=std)
            if isinstance(module, nn.Linear):
                module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                param.normal_(mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None) -> LMOutput:
        """idx (B, T) token ids (see GPTModel.forward for `cache`); targets (B, T) the next token at each position
        (idx shifted left by one, as nanoGPT; IGNORE_INDEX = not scored). The loss is label-smoothed only in training
        mode: in eval mode it is the plain cross-entropy, so exp(loss) is the held-out perplexity."""
        x = self.transformer(idx, cache)  # (B, T, C)
        logits = F.linear(x, self.transformer.wte.weight)  # (B, T, V)
        loss = None
        if targets is not None:
            smoothing = self.config.label_smoothing if self.training else 0.0
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                   label_smoothing=smoothing)
        return LMOutput(logits, loss)

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Scores (B, V) of the token after the last of idx (B, T), which are appended to `cache`: what a decoding step
        needs. The LM head runs on that position alone (over a T-token prompt forward() would multiply T x V)."""
        return F.linear(self.transformer(idx, cache)[:, -1], self.transformer.wte.weight)  # (B, C) x (V, C)^T

    def new_cache(self, batch_size: int, max_len: int, pad: torch.Tensor | None = None) -> KVCache:
        """An empty KV cache on this model's device and in its dtype."""
        weight = self.transformer.wte.weight
        return KVCache(self.config, batch_size, max_len, pad, device=weight.device, dtype=weight.dtype)


# -----------------------------------------------------------------------------
# Checkpoint I/O. Our format: config.json (GPTConfig fields + "format") and model.safetensors (the LM's state dict).

CHECKPOINT_FORMAT = "textrep-gpt"


def save_pretrained(model: GPTLMHeadModel, path) -> None:
    """Write `model` to directory `path` in our format (readable back with load_pretrained)."""
    save_checkpoint(model, path, CHECKPOINT_FORMAT)


def load_pretrained(path) -> GPTLMHeadModel:
    """Load a model written by save_pretrained (models.hf.gpt.load_ours_or_hf reads HuggingFace directories too)."""
    return load_checkpoint(Path(path), GPTLMHeadModel, GPTConfig, CHECKPOINT_FORMAT)


# -----------------------------------------------------------------------------
# Fine-tuning (GPT-1, Radford et al. 2018, Sec. 3.2-3.3; seed 004)


class GPTWithTaskHead(nn.Module):
    """A GPT language model whose token table has the task's N_SPECIAL new rows at its end (GPT-1 Sec. 3.3), and a
    linear task head on its final states; load_lm copies a pretrained LM's weights into the rest."""

    def __init__(self, config: GPTConfig, num_labels: int):
        super().__init__()
        self.config = config
        self.lm = GPTLMHeadModel(config)
        self.head = nn.Linear(config.n_embd, num_labels)
        nn.init.normal_(self.head.weight, std=config.initializer_range)
        nn.init.zeros_(self.head.bias)

    @property
    def encoder(self) -> GPTModel:
        return self.lm.transformer

    def load_lm(self, lm: GPTLMHeadModel) -> None:
        load_lm_with_new_tokens(self.lm, lm)


class GPTForSequenceClassification(GPTWithTaskHead):
    """GPT-1's discriminative fine-tuning: a linear head on the final state of each input's last token (the extract
    token; or what `pooling` names), plus the LM head kept for the auxiliary language-modelling loss (Sec. 3.2,
    weighted by λ in the caller).

    GPT-1 adds the start, delimiter and extract tokens to the vocabulary at fine-tuning time, randomly initialised
    (Sec. 3.3): here they are the last N_SPECIAL rows of the task model's own token table, so the pretrained vocabulary
    and tokenizer stay as they are. `config` is the task model's (vocab_size already counting them); load_lm copies a
    pretrained LM's weights into the rest.

    `pooling` (GPT_POOLINGS) is what the head reads of each sequence: "last", the extract token's final state (GPT-1);
    "mean", the mean of the final states of its tokens, start to extract; "last_embedding_mean", the extract state
    beside the mean of its tokens' embeddings (the rows of `wte`, without positions), through a LayerNorm of the head's
    own: piece-vector rows are of unit length on average (pipeline.engine.pretraining.start_word_embeddings) and their
    mean shorter still, beside a LayerNormed state of length about sqrt(n_embd), so one learning rate fits both halves.

    forward(idx (B, K, T), last (B, K)): K token sequences per example (2 for a similarity pair in both orders, Sec.
    3.3, their pooled vectors summed), right-padded, `last` the index of each one's extract token. Causal attention
    means no real token sees the padding after it, so no attention mask is needed, and the means stop at `last`.
    Returns (logits (B, num_labels), the mean next-token cross-entropy over each sequence's real tokens, or None
    without `lm_loss`: a caller that does not weigh it skips the LM head's product over the vocabulary, the largest
    matmul of a small model)."""

    N_SPECIAL = 3  # start, delimiter, extract: ids vocab_size - 3, -2, -1

    def __init__(self, config: GPTConfig, num_labels: int, pooling: str = "last"):
        if pooling not in GPT_POOLINGS:
            raise ValueError(f"pooling must be one of {GPT_POOLINGS}, got {pooling!r}")
        super().__init__(config, num_labels)
        self.pooling = pooling
        if pooling == "last_embedding_mean":
            self.embedding_norm = nn.LayerNorm(config.n_embd)
            self.head = nn.Linear(2 * config.n_embd, num_labels)
            nn.init.normal_(self.head.weight, std=config.initializer_range)
            nn.init.zeros_(self.head.bias)

    @property
    def special_ids(self) -> tuple[int, int, int]:
        """(start, delimiter, extract) token ids."""
        v = self.config.vocab_size
        return v - 3, v - 2, v - 1

    def forward(self, idx: torch.Tensor, last: torch.Tensor,
                lm_loss: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, K, T = idx.shape
        flat, flat_last = idx.reshape(B * K, T), last.reshape(B * K)
        h = self.encoder(flat)  # (B*K, T, C)
        positions = torch.arange(T, device=idx.device)
        pooled = self.pool(flat, h, flat_last, positions).view(B, K, -1).sum(1)  # (B, C), or (B, 2C)
        if not lm_loss:
            return self.head(pooled), None
        targets = flat[:, 1:].masked_fill(positions[None, 1:] > flat_last[:, None], IGNORE_INDEX)  # padding unscored
        lm_logits = F.linear(h[:, :-1], self.encoder.wte.weight)  # (B*K, T-1, V)
        loss = F.cross_entropy(lm_logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return self.head(pooled), loss

    def pool(self, idx: torch.Tensor, h: torch.Tensor, last: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """What the head reads of each sequence (`pooling`): idx (N, T), its final states h (N, T, C), last (N,)
        -> (N, C), or (N, 2C) for last_embedding_mean."""
        extract = h[torch.arange(h.size(0), device=h.device), last]  # (N, C)
        if self.pooling == "last":
            return extract
        real = (positions[None] <= last[:, None]).unsqueeze(-1).to(h.dtype)  # (N, T, 1): not the padding after last
        if self.pooling == "mean":
            return (h * real).sum(1) / real.sum(1)
        embeddings = self.encoder.wte(idx)  # (N, T, C)
        mean = (embeddings * real.to(embeddings.dtype)).sum(1) / real.sum(1)
        return torch.cat([extract, self.embedding_norm(mean).to(extract.dtype)], -1)


@torch.no_grad()
def load_lm_with_new_tokens(task_lm: GPTLMHeadModel, lm: GPTLMHeadModel) -> None:
    """A task model's LM weights from a pretrained one with fewer tokens: the task's new tokens (the last rows of its
    table) keep their fresh initialisation."""
    state = lm.state_dict()
    wte = task_lm.transformer.wte.weight.clone()
    wte[: lm.config.vocab_size] = state.pop("transformer.wte.weight")
    task_lm.load_state_dict({**state, "transformer.wte.weight": wte})


class GPTForTokenClassification(GPTWithTaskHead):
    """Tagging with a causal LM: the tag of each word read from two final states, at the word's last token and at the
    token after it (the next word's first token, or an end token after the last word). A left-to-right state at the
    word alone cannot tell the end of a word from its middle (B/M/E/S tags depend on the next character) nor use the
    next word, as a bidirectional tagger does (BERT's Sec. 5.3); the state after it alone holds the word only through
    attention, which a 2-layer model fine-tuned for a hundred steps barely learns (zh_pos token accuracy 0.41, against
    0.80 with both, on 800 held-out train sentences: docs/chinese.md). The end token is the last of the task model's
    N_SPECIAL new rows of the token table, as GPT-1's special tokens are (Sec. 3.3); load_lm copies a pretrained LM's
    weights into the rest.

    forward(input_ids (B, T), *_) takes BERT's tagger's arguments (token types and attention mask are not needed:
    right padding is never attended to by a real token) and returns logits (B, T, num_labels), position t's from the
    states at t and t + 1 (zeros after the last)."""

    N_SPECIAL = 1  # the end token: id vocab_size - 1

    def __init__(self, config: GPTConfig, num_labels: int):
        super().__init__(config, num_labels)
        self.head = nn.Linear(2 * config.n_embd, num_labels)
        nn.init.normal_(self.head.weight, std=config.initializer_range)
        nn.init.zeros_(self.head.bias)

    @property
    def end_id(self) -> int:
        return self.config.vocab_size - 1

    def forward(self, input_ids: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
        h = self.encoder(input_ids)  # (B, T, C)
        after = torch.cat([h[:, 1:], h.new_zeros(h.size(0), 1, h.size(2))], 1)  # (B, T, C): the state at t + 1
        return self.head(torch.cat([h, after], -1))  # (B, T, num_labels)
