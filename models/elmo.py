"""
ELMo (Peters et al. 2018, "Deep contextualized word representations", https://arxiv.org/abs/1802.05365) in one file.

Read top to bottom: config -> input encoding (bilm-tf's character ids) -> token encoders (character CNN or word
embeddings) -> one direction's LSTM stack -> shared softmax (full, adaptive or sampled) -> the biLM and its loss ->
ScalarMix -> feature-based downstream models (frozen word vectors and frozen biLM + scalar mix + small task head) ->
checkpoint I/O.

Sizes and details follow the paper's §3 and AllenAI's bilm-tf (`bilm/model.py`, options of the released 5.5B/original
model): a char-CNN over UTF-8 bytes with 2048 filters, 2 highway layers and a projection to 512; two layers of LSTMs
with 4096 cells projected to 512, a residual connection between them; a softmax over the word vocabulary that the
forward and backward LMs share, as they share the token encoder, while each direction has its own LSTMs.
bilm-tf also clips cell and projection values to [-3, 3]; `nn.LSTM` has no such option and we leave it out.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from conventions.elmo_words import BOS, EOS, UNK_ID, sentence_tokens
from models import IGNORE_INDEX
from models.checkpoint import config_from_dict, load_checkpoint, save_checkpoint

# bilm-tf `UnicodeCharsVocabulary`: UTF-8 bytes 0..255, then five marker characters. AllenNLP adds 1 to every id
# so that 0 can mean "no token here" (batch padding), which the char-CNN must tell apart from real characters.
MAX_CHARACTERS_PER_TOKEN = 50
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
N_CHARACTERS = 262  # 261 bilm-tf ids, shifted by one, plus 0

TOKEN_ENCODERS = ("char_cnn", "word")
SOFTMAXES = ("full", "adaptive", "sampled")
# bilm-tf's filter bank for the original ELMo: (width, number of filters), 2048 filters in all.
ORIGINAL_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


@dataclass
class ElmoConfig:
    vocab_size: int = 793471  # output vocabulary; the paper's is the 1B Word Benchmark's
    token_encoder: str = "char_cnn"  # "char_cnn": context-free layer from characters (paper); "word": a lookup table
    max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN  # bilm-tf: longer words are cut
    n_characters: int = N_CHARACTERS  # 256 bytes + 5 markers, shifted by 1 so that 0 is padding
    char_embedding_dim: int = 16
    filters: list = field(default_factory=lambda: [list(f) for f in ORIGINAL_FILTERS])  # [[width, count], ...]
    num_highway_layers: int = 2  # Srivastava et al. 2015 highway layers after the max-pooled filters
    projection_dim: int = 512  # token representation size and LSTM projection size (both directions)
    lstm_dim: int = 4096  # LSTM cells per layer and direction
    num_layers: int = 2  # L: 2L + 1 representations per token (x_k, and h_kj of each direction)
    dropout: float = 0.1  # bilm-tf's dropout on token and LSTM outputs
    softmax: str = "sampled"  # "full", "adaptive" (Grave et al. 2017) or "sampled" (Jean et al. 2015, bilm-tf)
    num_samples: int = 8192  # bilm-tf's n_negative_samples_batch for the sampled softmax
    # Head/tail boundaries for the adaptive softmax; null: the 1/16th and 1/4th most frequent ranks, which puts
    # about 90 % of running text in the head on Zipfian book vocabularies.
    adaptive_cutoffs: list | None = None

    def __post_init__(self):
        if self.token_encoder not in TOKEN_ENCODERS:
            raise ValueError(f"token_encoder must be one of {TOKEN_ENCODERS}, got {self.token_encoder!r}")
        if self.softmax not in SOFTMAXES:
            raise ValueError(f"softmax must be one of {SOFTMAXES}, got {self.softmax!r}")
        if self.softmax == "sampled" and self.num_samples >= self.vocab_size:
            raise ValueError(f"num_samples={self.num_samples} >= vocab_size={self.vocab_size}: sampling saves "
                             "nothing; use softmax=full")
        widest = max(width for width, _ in self.filters)
        if self.token_encoder == "char_cnn" and widest > self.max_characters_per_token:
            raise ValueError(f"filter width {widest} exceeds max_characters_per_token={self.max_characters_per_token}")

    @property
    def num_filters(self) -> int:
        return sum(count for _, count in self.filters)

    def resolved_cutoffs(self) -> list[int]:
        cutoffs = self.adaptive_cutoffs or [self.vocab_size // 16, self.vocab_size // 4]
        if not all(a < b for a, b in zip([0, *cutoffs], [*cutoffs, self.vocab_size])):
            raise ValueError(f"adaptive_cutoffs {cutoffs} must increase strictly within (0, {self.vocab_size})")
        return list(cutoffs)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ElmoConfig":
        return config_from_dict(cls, d)


# Named sizes. elmo_original: the paper's biLM. elmo_small: CPU-sized, the same architecture with a quarter of the
# filters, one highway layer, an eighth of the cells, a quarter of the projection and a full softmax.
ELMO_SIZES: dict[str, dict] = {
    "elmo_original": dict(),
    "elmo_small": dict(filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]], num_highway_layers=1,
                       projection_dim=128, lstm_dim=512, softmax="full"),
}


def elmo_config(name: str, **overrides) -> ElmoConfig:
    """The named size from ELMO_SIZES with any field overridden, e.g. elmo_config("elmo_small", vocab_size=8000)."""
    if name not in ELMO_SIZES:
        raise KeyError(f"unknown ELMo size {name!r}; known: {sorted(ELMO_SIZES)}")
    return ElmoConfig(**{**ELMO_SIZES[name], **overrides})


# -----------------------------------------------------------------------------
# Input encoding: sentences wrapped in <S> ... </S> (conventions/elmo_words.py), words as bilm-tf character ids (or as
# vocabulary ids)


def word_ids(tokens: Sequence[str], index: dict[str, int]) -> np.ndarray:
    return np.fromiter((index.get(t, UNK_ID) for t in tokens), dtype=np.int64, count=len(tokens))


@functools.lru_cache(maxsize=1 << 18)
def word_char_ids(word: str, max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN) -> tuple[int, ...]:
    """[begin-of-word, UTF-8 bytes (cut to fit), end-of-word, padding...], every id + 1 (bilm-tf, AllenNLP)."""
    if word == BOS:
        chars = [BOS_CHAR]
    elif word == EOS:
        chars = [EOS_CHAR]
    else:
        chars = list(word.encode("utf-8", "ignore")[: max_characters_per_token - 2])
    ids = [BOW_CHAR, *chars, EOW_CHAR] + [PAD_CHAR] * (max_characters_per_token - len(chars) - 2)
    return tuple(i + 1 for i in ids)


def tokens_char_ids(tokens: Sequence[str], max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN) -> np.ndarray:
    """(N, max_characters_per_token) int64 character ids of N tokens; (0, max_chars) for none."""
    out = np.zeros((len(tokens), max_characters_per_token), dtype=np.int64)
    for i, token in enumerate(tokens):
        out[i] = word_char_ids(token, max_characters_per_token)
    return out


def sentence_batch_inputs(sentences: Sequence[str | Sequence[str]], word_index: dict[str, int] | None,
                          max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN) -> tuple[np.ndarray, np.ndarray]:
    """A padded batch of sentences, each wrapped in <S> ... </S>: (inputs, mask (B, T) bool). A sentence is raw text
    (split by conventions.elmo_words.split_words) or a list of words taken as they are (CoNLL tokens, whose tags are per
    word). Inputs are (B, T, max_chars) char ids, or (B, T) word ids when a word_index is given (word-input biLMs)."""
    tokenized = [sentence_tokens(s) if isinstance(s, str) else [BOS, *s, EOS] for s in sentences]
    T = max((len(t) for t in tokenized), default=2)
    mask = np.zeros((len(tokenized), T), dtype=bool)
    shape = (len(tokenized), T) if word_index is not None else (len(tokenized), T, max_characters_per_token)
    inputs = np.zeros(shape, dtype=np.int64)
    for row, tokens in enumerate(tokenized):
        mask[row, : len(tokens)] = True
        inputs[row, : len(tokens)] = (word_ids(tokens, word_index) if word_index is not None
                                      else tokens_char_ids(tokens, max_characters_per_token))
    return inputs, mask


# -----------------------------------------------------------------------------
# Token encoders: the context-free layer x_k (shared by both directions)


class Highway(nn.Module):
    """y = g * x + (1 - g) * relu(W_h x), g = sigmoid(W_g x) (Srivastava et al. 2015, as in bilm-tf)."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)
        # Gate bias 1: start close to carrying the input through (AllenNLP's Highway does the same).
        nn.init.constant_(self.proj.bias[dim:], 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nonlinear, gate = self.proj(x).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * x + (1 - gate) * F.relu(nonlinear)


class CharCNNEncoder(nn.Module):
    """Kim et al. 2016's character CNN: char embeddings -> convolutions of several widths, max-pooled -> highway
    -> linear projection. Input (B, T, max_characters_per_token) character ids, 0 = no token."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.max_characters_per_token = config.max_characters_per_token
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, count, kernel_size=width)
                                          for width, count in config.filters)
        self.highways = nn.ModuleList(Highway(config.num_filters) for _ in range(config.num_highway_layers))
        self.projection = nn.Linear(config.num_filters, config.projection_dim)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        B, T, W = char_ids.shape
        if W != self.max_characters_per_token:
            raise ValueError(f"char ids have {W} characters per token, the model expects "
                             f"{self.max_characters_per_token}; encode words with tokens_char_ids")
        chars = self.char_embedding(char_ids.reshape(B * T, W))  # (B*T, W, E)
        pooled = []
        for conv in self.convolutions:
            # Each convolution as one matmul over all windows (B*T*(W-w+1) rows), not nn.Conv1d's kernel: ~1.3x
            # faster forward + backward on CPU at the paper's filter bank. The Conv1d modules hold the weights.
            count, E, width = conv.weight.shape
            windows = chars.unfold(1, width, 1).transpose(2, 3)  # (B*T, W-w+1, w, E)
            filters = conv.weight.transpose(1, 2).reshape(count, width * E)  # (n, w*E)
            out = torch.addmm(conv.bias, windows.reshape(-1, width * E), filters.T)  # (B*T*(W-w+1), n)
            # max over positions, then ReLU (bilm-tf's order; the same as ReLU then max). max() rather than amax():
            # its backward scatters into the one position per filter instead of comparing every position again.
            pooled.append(out.view(B * T, W - width + 1, count).max(dim=1).values)  # (B*T, n)
        x = torch.cat(pooled, dim=-1).relu()  # (B*T, F)
        for highway in self.highways:
            x = highway(x)
        return self.projection(x).view(B, T, self.projection.out_features)  # (B, T, P)


class WordEmbeddingEncoder(nn.Module):
    """The paper's ablation-friendly alternative: one vector per output-vocabulary word (OOV -> <UNK>)."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.projection_dim)

    def forward(self, word_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(word_ids)  # (B, T, P)


# -----------------------------------------------------------------------------
# One direction's LSTM stack


LayerState = tuple[torch.Tensor, torch.Tensor]  # (h (1, B, P), c (1, B, C)) as nn.LSTM takes it


class _ProjectedLSTMFunction(torch.autograd.Function):
    """One projected LSTM layer over a window, time-major. Autograd through nn.LSTM's step loop computes the weight
    gradients one time step at a time: T matmuls with only B rows of reduction each (~50 GFLOP/s here at B=64) plus T
    accumulations of (4C, P) and (P, C) gradients. This backward runs the recurrence for the state gradients only and
    then forms every weight gradient in one matmul over all T * B rows (~125 GFLOP/s)."""

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, bias, w_hr):
        # x (T, B, I), h0 (B, P), c0 (B, C); w_ih (4C, I), w_hh (4C, P), bias (4C,), w_hr (P, C); gates i, f, g, o
        T, B, _ = x.shape
        C = w_hh.shape[0] // 4
        gates = torch.addmm(bias, x.reshape(T * B, -1), w_ih.t()).view(T, B, 4 * C)  # input part, all steps at once
        cells = x.new_empty(T, B, C)
        hidden = x.new_empty(T, B, w_hr.shape[0])
        h, c = h0, c0
        w_hh_t, w_hr_t = w_hh.t().contiguous(), w_hr.t().contiguous()  # ~7 % faster B-row matmuls than transposed views
        for t in range(T):
            g = gates[t].addmm_(h, w_hh_t)  # (B, 4C), activated in place and kept for backward
            g[:, :2 * C].sigmoid_()
            g[:, 2 * C:3 * C].tanh_()
            g[:, 3 * C:].sigmoid_()
            i, f, g_, o = g.chunk(4, dim=1)
            c = torch.addcmul(f * c, i, g_, out=cells[t])  # (B, C)
            h = torch.mm(o * c.tanh(), w_hr_t, out=hidden[t])  # (B, P)
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, w_hr, gates, cells, hidden)
        return hidden, h.clone(), c.clone()  # the final state as tensors of their own, not views of the outputs

    @staticmethod
    def backward(ctx, grad_hidden, grad_h, grad_c):
        x, h0, c0, w_ih, w_hh, w_hr, gates, cells, hidden = ctx.saved_tensors
        T, B, _ = x.shape
        C = w_hh.shape[0] // 4
        tanh_cells = cells.tanh()
        # d(activation)/d(pre-activation) for every gate and step at once: s (1 - s) for sigmoids, 1 - g^2 for tanh
        slopes = gates * (1 - gates)
        slopes[..., 2 * C:3 * C] = 1 - gates[..., 2 * C:3 * C].square()
        grad_gates = torch.empty_like(gates)  # w.r.t. pre-activations
        grad_out = torch.zeros_like(hidden) if grad_hidden is None else \
            grad_hidden.clone(memory_format=torch.contiguous_format)  # (T, B, P): becomes dL/dh_t below
        dh = grad_h if grad_h is not None else h0.new_zeros(h0.shape)
        dc = grad_c if grad_c is not None else c0.new_zeros(c0.shape)
        for t in reversed(range(T)):
            dh_t = grad_out[t].add_(dh)  # total gradient reaching h_t, stored for the projection's weight gradient
            i, f, g_, o = gates[t].chunk(4, dim=1)
            dm = dh_t @ w_hr  # (B, C): gradient w.r.t. o * tanh(c_t)
            dc = dc + dm * o * (1 - tanh_cells[t].square())
            previous_c = cells[t - 1] if t else c0
            di, df, dg, do = grad_gates[t].chunk(4, dim=1)
            torch.mul(dc, g_, out=di)
            torch.mul(dc, previous_c, out=df)
            torch.mul(dc, i, out=dg)
            torch.mul(dm, tanh_cells[t], out=do)
            grad_gates[t].mul_(slopes[t])
            dc = dc * f
            dh = grad_gates[t] @ w_hh  # (B, P)
        flat_grad_gates = grad_gates.view(T * B, 4 * C)
        previous_h = torch.cat([h0[None], hidden[:-1]]).view(T * B, -1)
        grad_x = (flat_grad_gates @ w_ih).view(x.shape)
        # both input-side weight gradients in one matmul: twice the columns, one pass over the gate gradients
        grad_w_ih, grad_w_hh = (flat_grad_gates.t() @ torch.cat([x.reshape(T * B, -1), previous_h], dim=1)).split(
            [x.shape[2], previous_h.shape[1]], dim=1)
        grad_bias = flat_grad_gates.sum(0)
        outputs = gates[..., 3 * C:] * tanh_cells  # o * tanh(c), the projection's input
        grad_w_hr = grad_out.view(T * B, -1).t() @ outputs.view(T * B, C)
        return grad_x, dh, dc, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr


class ProjectedLSTM(nn.Module):
    """One layer of `nn.LSTM(input_size, hidden_size, proj_size=proj_size, batch_first=True)` (Sak et al. 2014's
    LSTMP): the same parameters under the same names, initialisation, gate order and call signature, with the faster
    backward of `_ProjectedLSTMFunction`. Runs in the autocast dtype when autocast is on, like nn.LSTM's matmuls."""

    def __init__(self, input_size: int, hidden_size: int, proj_size: int):
        super().__init__()
        self.hidden_size, self.proj_size = hidden_size, proj_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, proj_size))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.weight_hr_l0 = nn.Parameter(torch.empty(proj_size, hidden_size))
        bound = 1 / math.sqrt(hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x: torch.Tensor, state: LayerState | None = None) -> tuple[torch.Tensor, LayerState]:
        B = x.shape[0]
        if state is None:
            h0, c0 = x.new_zeros(B, self.proj_size), x.new_zeros(B, self.hidden_size)
        else:
            h0, c0 = state[0][0], state[1][0]
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        with torch.autocast("cpu", enabled=False):
            weights = [w.to(dtype) for w in (self.weight_ih_l0, self.weight_hh_l0)]
            bias = (self.bias_ih_l0 + self.bias_hh_l0).to(dtype)
            hidden, h, c = _ProjectedLSTMFunction.apply(x.transpose(0, 1).to(dtype).contiguous(), h0.to(dtype),
                                                        c0.to(dtype), *weights, bias, self.weight_hr_l0.to(dtype))
        return hidden.transpose(0, 1), (h[None], c[None])  # (B, T, P), ((1, B, P), (1, B, C))


class LstmStack(nn.Module):
    """num_layers LSTMs with a projection (Sak et al. 2014; nn.LSTM's proj_size) and a residual connection into
    every layer after the first (bilm-tf). Returns each layer's output: the biLM's per-layer representations."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        P = config.projection_dim
        self.layers = nn.ModuleList(ProjectedLSTM(P, config.lstm_dim, P) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, state: list[LayerState] | None) -> tuple[list[torch.Tensor], list[LayerState]]:
        outputs, new_state = [], []
        for i, lstm in enumerate(self.layers):
            h, layer_state = lstm(x, None if state is None else state[i])  # (B, T, P)
            h = self.dropout(h)
            x = h if i == 0 else h + x
            outputs.append(x)
            new_state.append(layer_state)
        return outputs, new_state


# -----------------------------------------------------------------------------
# Softmax shared by both directions


def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(k) under TF's log_uniform_candidate_sampler: P(k) = log((k + 2) / (k + 1)) / log(V + 1)."""
    return torch.log(torch.log1p(1.0 / (ids.double() + 1.0)) / math.log(vocab_size + 1)).float()


class SharedSoftmax(nn.Module):
    """Next-token NLL per position for both directions. `sampled` is a training-time estimate only: in eval mode it
    scores the full softmax, so held-out perplexities are exact whatever the training loss."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.kind, self.vocab_size, self.num_samples = config.softmax, config.vocab_size, config.num_samples
        # nn.Embedding's flag, which trainers read: the sampled softmax gives `weight` a sparse gradient; set False for
        # a dense one (same values), for trainers that cannot reduce sparse gradients
        self.sparse = self.kind == "sampled"
        if self.kind == "adaptive":
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(config.projection_dim, config.vocab_size,
                                                          config.resolved_cutoffs(), div_value=4.0)
        else:
            self.weight = nn.Parameter(torch.randn(config.vocab_size, config.projection_dim)
                                       / math.sqrt(config.projection_dim))
            self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def token_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """h (N, P), targets (N,) with IGNORE_INDEX for padding -> (N,) NLL, 0 where ignored."""
        keep = targets != IGNORE_INDEX
        nll = h.new_zeros(targets.shape)
        if not bool(keep.any()):
            return nll + 0 * h.sum()  # keeps the graph connected for an all-padding batch
        h, kept_targets = h[keep], targets[keep]
        if self.kind == "adaptive":
            values = -self.adaptive(h, kept_targets).output
        elif self.kind == "sampled" and self.training:
            values = self._sampled_nll(h, kept_targets)
        else:
            values = F.cross_entropy(F.linear(h, self.weight, self.bias).float(), kept_targets, reduction="none")
        return nll.masked_scatter(keep, values.to(nll.dtype))

    def _sampled_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Sampled softmax as TF's sampled_softmax_loss (bilm-tf): one set of num_samples log-uniform candidates per
        batch, logits corrected by -log(expected count), candidates equal to the target removed."""
        V, K = self.vocab_size, self.num_samples
        u = torch.rand(K, device=h.device, dtype=torch.float64)
        samples = (torch.exp(u * math.log(V + 1)).floor().long() - 1).clamp_(0, V - 1)  # inverse CDF, (K,)
        log_expected = lambda ids: log_uniform_log_prob(ids, V) + math.log(K)  # noqa: E731
        # One gather for targets and candidates, with a sparse gradient: only these N + K rows of the (V, P) matrix
        # get one, as TF's IndexedSlices give bilm-tf. A dense gradient would be a fresh 1.6 GB at the paper's 793k
        # words each step, which took longer than the logits. Optimise with pipeline.engine.optim.LazyAdamW.
        N, ids = len(targets), torch.cat([targets, samples])
        rows = F.embedding(ids, self.weight, sparse=self.sparse)  # (N + K, P)
        biases = self.bias[ids] - log_expected(ids)  # (N + K,)
        true_logits = (h * rows[:N]).sum(-1) + biases[:N]  # (N,)
        sampled_logits = h @ rows[N:].T + biases[N:]  # (N, K)
        sampled_logits = sampled_logits.masked_fill(samples[None, :] == targets[:, None], float("-inf"))
        logits = torch.cat([true_logits[:, None], sampled_logits], dim=1).float()  # (N, 1 + K)
        return F.cross_entropy(logits, torch.zeros_like(targets), reduction="none")


# -----------------------------------------------------------------------------
# The biLM


BiLMState = tuple[list[LayerState], list[LayerState]]  # (forward layers, backward layers)


class BiLMOutput(NamedTuple):
    loss: torch.Tensor  # mean forward NLL + mean backward NLL: the paper's sum of the two log likelihoods
    forward_nll_sum: torch.Tensor
    backward_nll_sum: torch.Tensor
    forward_tokens: torch.Tensor  # predicted (non-padding) positions
    backward_tokens: torch.Tensor
    state: BiLMState  # the LSTM states after the window, for the next window of the same rows


def reset_state_rows(state: BiLMState, reset: torch.Tensor) -> BiLMState:
    """Zero the carried state of the rows where `reset` (B,) is true: they start a new book."""
    keep = (~reset).to(state[0][0][0].dtype)
    return tuple([(h * keep[None, :, None], c * keep[None, :, None]) for h, c in direction]
                 for direction in state)


def detach_state(state: BiLMState) -> BiLMState:
    """Truncated BPTT: the next window starts from these values but sends no gradient back into this one."""
    return tuple([(h.detach(), c.detach()) for h, c in direction] for direction in state)


def reversal_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) index that reverses each row's first mask.sum() positions and leaves its padding in place."""
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device)[None, :]  # (1, T)
    lengths = mask.sum(1, keepdim=True)  # (B, 1)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)


class BiLanguageModel(nn.Module):
    """Forward and backward LSTM LMs over one shared token encoder and one shared softmax (Peters et al. §3.1)."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.config = config
        char_cnn = config.token_encoder == "char_cnn"
        self.token_encoder = CharCNNEncoder(config) if char_cnn else WordEmbeddingEncoder(config)
        self.dropout = nn.Dropout(config.dropout)
        self.forward_lstm = LstmStack(config)
        self.backward_lstm = LstmStack(config)
        self.softmax = SharedSoftmax(config)

    def forward(self, forward_inputs: torch.Tensor, backward_inputs: torch.Tensor, forward_targets: torch.Tensor,
                backward_targets: torch.Tensor, state: BiLMState | None = None,
                reset: torch.Tensor | None = None) -> BiLMOutput:
        """One window of each LM. The backward inputs are the reversed stream (bilm-tf), so both directions read
        left to right here; inputs (B, T, max_chars) char ids or (B, T) word ids, targets (B, T) next-token ids."""
        B = forward_inputs.shape[0]
        if state is not None and reset is not None:
            state = reset_state_rows(state, reset)
        # Both directions in one pass through the shared encoder: twice the rows for the same weights.
        x = self.dropout(self.token_encoder(torch.cat([forward_inputs, backward_inputs])))  # (2B, T, P)
        fwd_layers, fwd_state = self.forward_lstm(x[:B], None if state is None else state[0])
        bwd_layers, bwd_state = self.backward_lstm(x[B:], None if state is None else state[1])
        top = torch.cat([fwd_layers[-1], bwd_layers[-1]])  # (2B, T, P)
        targets = torch.cat([forward_targets, backward_targets])  # (2B, T)
        nll = self.softmax.token_nll(top.flatten(0, 1), targets.flatten()).view(2, -1)  # (2, B*T)
        counts = (targets != IGNORE_INDEX).view(2, -1).sum(1)  # (2,)
        sums = nll.sum(1)
        loss = (sums / counts.clamp(min=1)).sum()
        return BiLMOutput(loss, sums[0], sums[1], counts[0], counts[1], (fwd_state, bwd_state))

    def layer_representations(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The 2L + 1 representations of every token of a padded batch of sentences, each from a zero state, as the
        paper's L + 1 vectors h_kj (eq. 1): (B, L + 1, T, 2P). h_k0 is the token layer x_k repeated for both directions,
        h_kj = [forward h_kj; backward h_kj] (bilm-tf, AllenNLP); padding is zero."""
        x = self.dropout(self.token_encoder(inputs))  # (B, T, P)
        index = reversal_index(mask)[:, :, None].expand_as(x)  # (B, T, P)
        fwd_layers, _ = self.forward_lstm(x, None)
        bwd_layers, _ = self.backward_lstm(x.gather(1, index), None)  # padding stays after each reversed row
        layers = [torch.cat([x, x], -1)] + [torch.cat([f, b.gather(1, index)], -1)
                                           for f, b in zip(fwd_layers, bwd_layers)]
        return torch.stack(layers, 1) * mask[:, None, :, None].to(x.dtype)


# -----------------------------------------------------------------------------
# ScalarMix: ELMo_k = gamma * sum_j softmax(s)_j h_kj over j = 0..L (Peters et al. eq. 1)


class ScalarMix(nn.Module):
    """One task's weighting of the biLM's layers h_k0..h_kL (which hold the 2L + 1 representations). With
    do_layer_norm each layer is first normalised over all its unmasked values (Peters et al. §3.2: "in some cases it
    helped to apply layer normalization"). gamma_init is γ's start: the paper's 1, or 0 for a mix that adds nothing
    to a task model's input until training scales it up."""

    def __init__(self, num_representations: int, do_layer_norm: bool = False, gamma_init: float = 1.0):
        super().__init__()
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.zeros(num_representations))  # s; zeros = plain average
        self.gamma = nn.Parameter(torch.tensor(float(gamma_init)))

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.scalar_parameters, dim=0)

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """layers (B, K, T, D), mask (B, T) -> (B, T, D)."""
        if self.do_layer_norm:
            valid = mask[:, None, :, None].to(layers.dtype)  # (B, 1, T, 1)
            n = valid.sum((0, 2, 3), keepdim=True).clamp(min=1) * layers.shape[-1]
            mean = (layers * valid).sum((0, 2, 3), keepdim=True) / n  # (1, K, 1, 1)
            var = (((layers - mean) * valid) ** 2).sum((0, 2, 3), keepdim=True) / n
            layers = (layers - mean) / torch.sqrt(var + 1e-12) * valid
        return self.gamma * torch.einsum("k,bktd->btd", self.weights(), layers)


# -----------------------------------------------------------------------------
# Feature-based downstream use: a frozen biLM, one trainable ScalarMix per task, a small head over the mix and the task
# model's own frozen word vectors


class ElmoEmbedder(nn.Module):
    """Raw sentences -> (B, L + 1, T, 2P) word representations and a (B, T) word mask. <S> and </S> are given to
    the biLM, as in pretraining, and removed from the output. `vocab` (a word list) is needed only by word inputs."""

    def __init__(self, bilm: BiLanguageModel, vocab: list[str] | None = None):
        super().__init__()
        self.bilm = bilm
        if bilm.config.token_encoder == "word" and vocab is None:
            raise ValueError("a word-input biLM needs its vocabulary: ElmoEmbedder(bilm, vocab=read_word_vocab(...))")
        self.word_index = None if vocab is None else {w: i for i, w in enumerate(vocab)}

    def batch_inputs(self, sentences: list[str] | list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """What a DataLoader's collate_fn should produce: (inputs, mask) including the sentence boundary tokens;
        sentences as raw text or as lists of words (see sentence_batch_inputs)."""
        word_index = self.word_index if self.bilm.config.token_encoder == "word" else None
        inputs, mask = sentence_batch_inputs(sentences, word_index, self.bilm.config.max_characters_per_token)
        return torch.from_numpy(inputs), torch.from_numpy(mask)

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layers = self.bilm.layer_representations(inputs, mask)  # (B, K, T + 2, 2P)
        word_mask = mask[:, 2:]  # a row of n words has n + 2 valid positions; words sit at 1..n
        return layers[:, :, 1:-1] * word_mask[:, None, :, None].to(layers.dtype), word_mask

    def embed(self, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self(*self.batch_inputs(sentences))


@dataclass(frozen=True)
class MixSettings:
    """How a task model mixes the frozen biLM's layers into ELMo vectors: each layer normalised first or not, γ's
    start (ScalarMix), and the dropout on the mixed vectors, which Peters et al. add to ELMo alone (§3.3)."""
    do_layer_norm: bool = False
    gamma_init: float = 1.0
    dropout: float = 0.5


class ElmoFeatures(nn.Module):
    """Frozen biLM + a trainable ScalarMix (+ dropout, as the paper adds to ELMo vectors): (B, T, 2P) features."""

    def __init__(self, bilm: BiLanguageModel, vocab: list[str] | None = None, mix: MixSettings = MixSettings()):
        super().__init__()
        self.embedder = ElmoEmbedder(bilm, vocab)
        self.embedder.requires_grad_(False)
        self.mix = ScalarMix(bilm.config.num_layers + 1, mix.do_layer_norm, mix.gamma_init)
        self.dropout = nn.Dropout(mix.dropout)
        self.output_dim = 2 * bilm.config.projection_dim

    def train(self, mode: bool = True) -> "ElmoFeatures":
        super().train(mode)
        self.embedder.eval()  # frozen means no dropout inside the biLM either
        return self

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            layers, word_mask = self.embedder(inputs, mask)
        return self.dropout(self.mix(layers, word_mask)), word_mask


class BiLSTMHead(nn.Module):
    """A one-layer BiLSTM over the ELMo features, run on packed sequences so padding never enters the states."""

    def __init__(self, input_dim: int, hidden_size: int):
        super().__init__()
        self.lstm = nn.LSTM(input_dim, hidden_size, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()  # an empty sentence still gets one (zero) step
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out  # (B, T, 2H)


class ElmoTaskModel(nn.Module):
    """A BiLSTM over each word's [word vector; ELMo], under a task's output layers (the subclasses add them). Peters
    et al. (2018, §3.3) add ELMo to a task model that already reads pretrained word vectors (GloVe there), by
    concatenating the two at its input, and measure ELMo's gain against that model without it: `word_vectors` (V, d),
    one frozen row per word of the biLM's vocabulary (None: ELMo alone), and `bilm` (None: the word vectors alone, the
    task model without ELMo), mixed as `mix` says. Only the mix, the BiLSTM and the output layers train."""

    def __init__(self, bilm: BiLanguageModel | None, hidden_size: int, vocab: list[str] | None, mix: MixSettings,
                 word_vectors: torch.Tensor | None = None):
        super().__init__()
        if bilm is None and word_vectors is None:
            raise ValueError("a task model reads ELMo (bilm), word vectors, or both; it was given neither")
        self.features = None if bilm is None else ElmoFeatures(bilm, vocab, mix)
        self.word_vectors = None if word_vectors is None else nn.Embedding.from_pretrained(word_vectors, freeze=True)
        self.input_dim = ((0 if word_vectors is None else word_vectors.shape[1])
                          + (0 if bilm is None else self.features.output_dim))
        self.bilstm = BiLSTMHead(self.input_dim, hidden_size)

    @property
    def encoder(self) -> BiLanguageModel | None:
        """The pretrained encoder under the task layers, whatever the family calls it (frozen here); None without."""
        return None if self.features is None else self.features.embedder.bilm

    def word_representations(self, inputs: torch.Tensor | None, word_ids: torch.Tensor | None,
                             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, input_dim) [word vector; ELMo] of every word and the (B, T) word mask, from a batch of sentences
        wrapped in <S> ... </S>: the biLM's `inputs` (ElmoEmbedder.batch_inputs), the vocabulary ids `word_ids`
        (B, T + 2) of the word vectors' rows, and `mask` (B, T + 2)."""
        word_mask = mask[:, 2:]  # a row of n words has n + 2 valid positions; words sit at 1..n
        parts = [] if self.word_vectors is None else [self.word_vectors(word_ids[:, 1:-1])]  # (B, T, d)
        if self.features is not None:
            parts.append(self.features(inputs, mask)[0])  # (B, T, 2P)
        return torch.cat(parts, -1), word_mask


class ElmoSentenceClassifier(ElmoTaskModel):
    """Single sentences or pairs: [word vectors; ELMo] -> BiLSTM -> max-pool to u (InferSent, Conneau et al. 2017); a
    pair is classified from [u, v, |u - v|, u * v]."""

    def __init__(self, bilm: BiLanguageModel | None, num_labels: int, hidden_size: int = 256, pair: bool = False,
                 vocab: list[str] | None = None, dropout: float = 0.5, word_vectors: torch.Tensor | None = None,
                 mix: MixSettings = MixSettings()):
        super().__init__(bilm, hidden_size, vocab, mix, word_vectors)
        self.pair = pair
        self.classifier = nn.Sequential(nn.Linear((4 if pair else 1) * 2 * hidden_size, hidden_size), nn.ReLU(),
                                        nn.Dropout(dropout), nn.Linear(hidden_size, num_labels))

    def encode(self, inputs: torch.Tensor | None, word_ids: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        x, word_mask = self.word_representations(inputs, word_ids, mask)
        h = self.bilstm(x, word_mask)  # (B, T, 2H)
        h = h.masked_fill(~word_mask.bool()[:, :, None], float("-inf")).amax(1)  # (B, 2H)
        return torch.where(torch.isinf(h), torch.zeros_like(h), h)  # an empty sentence pools to zeros

    def forward(self, inputs: torch.Tensor | None, mask: torch.Tensor, pair_inputs: torch.Tensor | None = None,
                pair_mask: torch.Tensor | None = None, word_ids: torch.Tensor | None = None,
                pair_word_ids: torch.Tensor | None = None) -> torch.Tensor:
        u = self.encode(inputs, word_ids, mask)
        if self.pair != (pair_mask is not None):
            raise ValueError(f"this classifier was built with pair={self.pair}; pass pair_mask (and its inputs) "
                             "exactly when it is a sentence-pair classifier")
        if self.pair:
            v = self.encode(pair_inputs, pair_word_ids, pair_mask)
            u = torch.cat([u, v, (u - v).abs(), u * v], -1)
        return self.classifier(u)  # (B, num_labels)


class ElmoTokenTagger(ElmoTaskModel):
    """Token tagging (NER, POS): [word vectors; ELMo] -> BiLSTM -> a label per word, (B, T_words, num_tags)."""

    def __init__(self, bilm: BiLanguageModel | None, num_tags: int, hidden_size: int = 256,
                 vocab: list[str] | None = None, word_vectors: torch.Tensor | None = None,
                 mix: MixSettings = MixSettings()):
        super().__init__(bilm, hidden_size, vocab, mix, word_vectors)
        self.output = nn.Linear(2 * hidden_size, num_tags)

    def forward(self, inputs: torch.Tensor | None, mask: torch.Tensor,
                word_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, word_mask = self.word_representations(inputs, word_ids, mask)
        return self.output(self.bilstm(x, word_mask)), word_mask


# -----------------------------------------------------------------------------
# Checkpoints: config.json + model.safetensors


CHECKPOINT_FORMAT = "textrep-elmo-bilm"


def save_pretrained(model: BiLanguageModel, out_dir: str | Path) -> None:
    save_checkpoint(model, out_dir, CHECKPOINT_FORMAT)


def load_pretrained(out_dir: str | Path) -> BiLanguageModel:
    return load_checkpoint(out_dir, BiLanguageModel, ElmoConfig, CHECKPOINT_FORMAT)
