"""
ELMo (Peters et al. 2018, "Deep contextualized word representations", https://arxiv.org/abs/1802.05365) in one file.

Read top to bottom: config -> token encoders (character CNN or word embeddings) -> one direction's LSTM stack ->
shared softmax (full, adaptive or sampled) -> the biLM and its loss -> ScalarMix -> feature-based downstream models
(frozen biLM + scalar mix + small task head) -> checkpoint I/O.

Sizes and details follow the paper's §3 and AllenAI's bilm-tf (`bilm/model.py`, options of the released 5.5B/original
model): a char-CNN over UTF-8 bytes with 2048 filters, 2 highway layers and a projection to 512; two layers of LSTMs
with 4096 cells projected to 512, a residual connection between them; a softmax over the word vocabulary that the
forward and backward LMs share, as they share the token encoder, while each direction has its own LSTMs.
bilm-tf also clips cell and projection values to [-3, 3]; `nn.LSTM` has no such option and we leave it out.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from models.checkpoint import config_from_dict, load_checkpoint, save_checkpoint

from data_prep.elmo_examples import IGNORE_TARGET, MAX_CHARACTERS_PER_TOKEN, N_CHARACTERS, sentence_batch_inputs

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
                             f"{self.max_characters_per_token}; encode words with data_prep.elmo_examples")
        chars = self.char_embedding(char_ids.reshape(B * T, W)).transpose(1, 2)  # (B*T, E, W)
        # max over positions, then ReLU (bilm-tf's order; the same as ReLU then max)
        x = torch.cat([conv(chars).amax(dim=-1) for conv in self.convolutions], dim=-1).relu()  # (B*T, F)
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


class LstmStack(nn.Module):
    """num_layers LSTMs with a projection (Sak et al. 2014; nn.LSTM's proj_size) and a residual connection into
    every layer after the first (bilm-tf). Returns each layer's output: the biLM's per-layer representations."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        P = config.projection_dim
        self.layers = nn.ModuleList(nn.LSTM(P, config.lstm_dim, proj_size=P, batch_first=True)
                                    for _ in range(config.num_layers))
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
        if self.kind == "adaptive":
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(config.projection_dim, config.vocab_size,
                                                          config.resolved_cutoffs(), div_value=4.0)
        else:
            self.weight = nn.Parameter(torch.randn(config.vocab_size, config.projection_dim)
                                       / math.sqrt(config.projection_dim))
            self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def token_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """h (N, P), targets (N,) with IGNORE_TARGET for padding -> (N,) NLL, 0 where ignored."""
        keep = targets != IGNORE_TARGET
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
        true_logits = (h * self.weight[targets]).sum(-1) + self.bias[targets] - log_expected(targets)  # (N,)
        sampled_logits = h @ self.weight[samples].T + self.bias[samples] - log_expected(samples)  # (N, K)
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
        counts = (targets != IGNORE_TARGET).view(2, -1).sum(1)  # (2,)
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
    do_layer_norm each layer is first normalised over all its unmasked values (Peters et al. §3.2: "in some cases it helped to apply layer normalization")."""

    def __init__(self, num_representations: int, do_layer_norm: bool = False):
        super().__init__()
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.zeros(num_representations))  # s; zeros = plain average
        self.gamma = nn.Parameter(torch.ones(()))

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
# Feature-based downstream use: a frozen biLM, one trainable ScalarMix per task, a small head


class ElmoEmbedder(nn.Module):
    """Raw sentences -> (B, L + 1, T, 2P) word representations and a (B, T) word mask. <S> and </S> are given to
    the biLM, as in pretraining, and removed from the output. `vocab` (a word list) is needed only by word inputs."""

    def __init__(self, bilm: BiLanguageModel, vocab: list[str] | None = None):
        super().__init__()
        self.bilm = bilm
        if bilm.config.token_encoder == "word" and vocab is None:
            raise ValueError("a word-input biLM needs its vocabulary: ElmoEmbedder(bilm, vocab=read_word_vocab(...))")
        self.word_index = None if vocab is None else {w: i for i, w in enumerate(vocab)}

    def batch_inputs(self, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """What a DataLoader's collate_fn should produce: (inputs, mask) including the sentence boundary tokens."""
        word_index = self.word_index if self.bilm.config.token_encoder == "word" else None
        inputs, mask = sentence_batch_inputs(sentences, word_index, self.bilm.config.max_characters_per_token)
        return torch.from_numpy(inputs), torch.from_numpy(mask)

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layers = self.bilm.layer_representations(inputs, mask)  # (B, K, T + 2, 2P)
        word_mask = mask[:, 2:]  # a row of n words has n + 2 valid positions; words sit at 1..n
        return layers[:, :, 1:-1] * word_mask[:, None, :, None].to(layers.dtype), word_mask

    def embed(self, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self(*self.batch_inputs(sentences))


class ElmoFeatures(nn.Module):
    """Frozen biLM + a trainable ScalarMix (+ dropout, as the paper adds to ELMo vectors): (B, T, 2P) features."""

    def __init__(self, bilm: BiLanguageModel, vocab: list[str] | None = None, do_layer_norm: bool = False,
                 dropout: float = 0.5):
        super().__init__()
        self.embedder = ElmoEmbedder(bilm, vocab)
        self.embedder.requires_grad_(False)
        self.mix = ScalarMix(bilm.config.num_layers + 1, do_layer_norm)
        self.dropout = nn.Dropout(dropout)
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


class ElmoSentenceClassifier(nn.Module):
    """Single sentences or pairs: ELMo -> BiLSTM -> max-pool to u (InferSent, Conneau et al. 2017); a pair is
    classified from [u, v, |u - v|, u * v]. Only the mix, the BiLSTM and the output layers train."""

    def __init__(self, bilm: BiLanguageModel, num_labels: int, hidden_size: int = 256, pair: bool = False,
                 vocab: list[str] | None = None, do_layer_norm: bool = False, dropout: float = 0.5):
        super().__init__()
        self.pair = pair
        self.features = ElmoFeatures(bilm, vocab, do_layer_norm, dropout)
        self.encoder = BiLSTMHead(self.features.output_dim, hidden_size)
        self.classifier = nn.Sequential(nn.Linear((4 if pair else 1) * 2 * hidden_size, hidden_size), nn.ReLU(),
                                        nn.Dropout(dropout), nn.Linear(hidden_size, num_labels))

    def encode(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x, word_mask = self.features(inputs, mask)
        h = self.encoder(x, word_mask)  # (B, T, 2H)
        h = h.masked_fill(~word_mask.bool()[:, :, None], float("-inf")).amax(1)  # (B, 2H)
        return torch.where(torch.isinf(h), torch.zeros_like(h), h)  # an empty sentence pools to zeros

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor, pair_inputs: torch.Tensor | None = None,
                pair_mask: torch.Tensor | None = None) -> torch.Tensor:
        u = self.encode(inputs, mask)
        if self.pair != (pair_inputs is not None):
            raise ValueError(f"this classifier was built with pair={self.pair}; pass pair_inputs/pair_mask "
                             "exactly when it is a sentence-pair classifier")
        if self.pair:
            v = self.encode(pair_inputs, pair_mask)
            u = torch.cat([u, v, (u - v).abs(), u * v], -1)
        return self.classifier(u)  # (B, num_labels)


class ElmoTokenTagger(nn.Module):
    """Token tagging (NER, POS): ELMo -> BiLSTM -> a label per word, (B, T_words, num_tags)."""

    def __init__(self, bilm: BiLanguageModel, num_tags: int, hidden_size: int = 256,
                 vocab: list[str] | None = None, do_layer_norm: bool = False, dropout: float = 0.5):
        super().__init__()
        self.features = ElmoFeatures(bilm, vocab, do_layer_norm, dropout)
        self.encoder = BiLSTMHead(self.features.output_dim, hidden_size)
        self.output = nn.Linear(2 * hidden_size, num_tags)

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, word_mask = self.features(inputs, mask)
        return self.output(self.encoder(x, word_mask)), word_mask


# -----------------------------------------------------------------------------
# Checkpoints: config.json + model.safetensors


CHECKPOINT_FORMAT = "textrep-elmo-bilm"


def save_bilm(model: BiLanguageModel, out_dir: str | Path) -> None:
    save_checkpoint(model, out_dir, CHECKPOINT_FORMAT)


def load_bilm(out_dir: str | Path) -> BiLanguageModel:
    return load_checkpoint(out_dir, BiLanguageModel, ElmoConfig, CHECKPOINT_FORMAT)
