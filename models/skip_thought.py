"""
Skip-Thought vectors (Kiros et al. 2015, https://arxiv.org/abs/1506.06726) in one file of plain PyTorch.

A GRU encodes sentence s_i into a vector; two GRU decoders with their own parameters predict the previous sentence
s_{i-1} and the next sentence s_{i+1} word by word (teacher forcing). Each decoder sees the sentence vector at *every*
step through its own matrices (paper eqs. 5-8: the C_r h_i, C_z h_i, C h_i terms), not only as its initial state.
Word embeddings and the output projection V are shared by the two decoders (and, as in the authors' code, the
encoder reads the same embedding table).

Quick-Thoughts (Logeswaran & Lee 2018, https://arxiv.org/abs/1803.02893) replace the decoders by a classifier: two
encoders f and g (own parameters, one embedding table), and each sentence must pick its true context sentences out of
the batch's candidates by the inner products f(s)·g(c), under a softmax. No word is predicted, so a step costs three
encoder passes instead of two decoders with a vocabulary softmax; its sentence vector is [f(s); g(s)].

Read top to bottom: config -> GRU layer (with a hand-written backward, see `GRURecurrence`) -> encoders (uni-skip,
bi-skip) -> `SkipThoughts` (encoder + two decoders + shared softmax) -> `QuickThoughts` (f, g and their scores) ->
`CombineSkip` (uni ⊕ bi) -> `SkipThoughtClassifier` (the linear model on frozen vectors for downstream tasks) ->
checkpoint I/O.

Batches come in as right-padded (B, T) id tensors with their lengths; inside, everything is time-major (T, B, ...)
so that every time step is one contiguous slice.
"""

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.checkpoint import config_from_dict, load_checkpoint, save_checkpoint

ENCODER_KINDS = ("uni", "bi")
# what trains the encoder: Skip-Thought's decoders, or Quick-Thoughts' choice among candidates (`skip_thought_model`)
OBJECTIVES = ("skip_thought", "quick_thought")
CHECKPOINT_FORMAT = "textrep-skip-thoughts-v1"


@dataclass
class SkipThoughtConfig:
    vocab_size: int = 20000  # the paper keeps the 20k most frequent BookCorpus words; vocabulary expansion adds more
    embedding_dim: int = 620  # paper, sec. 3
    # Size of the sentence vector. "uni": one GRU of this size (uni-skip, 2400-d). "bi": a forward GRU and a GRU over
    # the reversed sentence, each of half this size, concatenated (bi-skip, 2 x 1200-d).
    encoder_dim: int = 2400
    encoder: str = "uni"
    decoder_dim: int = 2400  # the authors' code sizes the decoders like the encoder (Quick-Thoughts have none)
    objective: str = "skip_thought"
    pad_id: int = 0  # only used to build the loss mask; lengths, not this id, decide what the encoder reads
    # Kiros et al. sec. 3: non-recurrent weights ~ U(-0.1, 0.1), recurrent matrices orthogonal.
    init_range: float = 0.1

    def __post_init__(self):
        if self.encoder not in ENCODER_KINDS:
            raise ValueError(f"encoder must be one of {ENCODER_KINDS}, got {self.encoder!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.encoder == "bi" and self.encoder_dim % 2:
            raise ValueError(f"bi-skip splits encoder_dim between two GRUs; {self.encoder_dim} is odd")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SkipThoughtConfig":
        return config_from_dict(cls, d)


SKIP_THOUGHT_SIZES: dict[str, dict] = {
    # Kiros et al. 2015, sec. 3 (uni-skip; bi-skip is the same with encoder="bi").
    "skip_thought_paper": dict(vocab_size=20000, embedding_dim=620, encoder_dim=2400, decoder_dim=2400),
    # Trains in minutes on a few CPU cores; same architecture, ~1/5 of the width.
    "skip_thought_small": dict(vocab_size=8000, embedding_dim=128, encoder_dim=512, decoder_dim=512),
}


def skip_thought_config(name: str, **overrides) -> SkipThoughtConfig:
    """The named size from SKIP_THOUGHT_SIZES with any field overridden, e.g.
    skip_thought_config("skip_thought_small", encoder="bi")."""
    if name not in SKIP_THOUGHT_SIZES:
        raise KeyError(f"unknown Skip-Thought size {name!r}; known: {sorted(SKIP_THOUGHT_SIZES)}")
    return SkipThoughtConfig(**{**SKIP_THOUGHT_SIZES[name], **overrides})


# -----------------------------------------------------------------------------
# GRU


class GRURecurrence(torch.autograd.Function):
    """The time loop of a GRU whose input-side gate pre-activations are already computed.

    Gates (PyTorch's nn.GRU convention, r/z/n order): r = σ(a_r + W_hr h + b_hr), z = σ(a_z + W_hz h + b_hz),
    n = tanh(a_n + r ⊙ (W_hn h + b_hn)), h' = (1 - z) ⊙ n + z ⊙ h, where a = input_gates[t].

    Why a hand-written backward: under plain autograd every step's matmul produces its own (3H, H) weight gradient
    (B = 32 rows of work writing a 69 MB matrix at H = 2400), summed T times -- memory-bound. Here the backward loop
    only carries dh; the weight gradient is one (3H, T·B) @ (T·B, H) matmul after the loop, as cuDNN does.
    """

    @staticmethod
    def forward(ctx, input_gates, h0, weight_hh, bias_hh):
        T, B, H3 = input_gates.shape  # (T, B, 3H)
        H = H3 // 3
        states = input_gates.new_empty(T, B, H)
        rz = input_gates.new_empty(T, B, 2 * H)  # sigmoid gates r, z, kept for the backward
        n = input_gates.new_empty(T, B, H)
        hn = input_gates.new_empty(T, B, H)  # W_hn h + b_hn, needed for dr
        h = h0
        for t in range(T):
            gh = torch.addmm(bias_hh, h, weight_hh.t())  # (B, 3H)
            torch.add(input_gates[t, :, : 2 * H], gh[:, : 2 * H], out=rz[t]).sigmoid_()
            r, z = rz[t, :, :H], rz[t, :, H:]
            hn[t] = gh[:, 2 * H:]
            torch.addcmul(input_gates[t, :, 2 * H:], r, hn[t], out=n[t]).tanh_()
            torch.addcmul(n[t], z, h - n[t], out=states[t])  # (1 - z) n + z h
            h = states[t]
        ctx.save_for_backward(h0, weight_hh, states, rz, n, hn)
        return states

    @staticmethod
    def backward(ctx, grad_states):
        h0, weight_hh, states, rz, n, hn = ctx.saved_tensors
        T, B, H = states.shape
        previous = torch.cat([h0.unsqueeze(0), states[:-1]])  # (T, B, H): the h each step started from
        grad_input_gates = states.new_empty(T, B, 3 * H)
        grad_hidden_gates = states.new_empty(T, B, 3 * H)
        dh = torch.zeros_like(h0)
        for t in reversed(range(T)):
            dh = dh + grad_states[t]
            r, z = rz[t, :, :H], rz[t, :, H:]
            d_n = dh * (1 - z) * (1 - n[t] * n[t])  # through h' = (1-z) n + z h, then tanh
            d_r = d_n * hn[t] * r * (1 - r)
            d_z = dh * (previous[t] - n[t]) * z * (1 - z)
            grad_input_gates[t, :, :H], grad_input_gates[t, :, H:2 * H], grad_input_gates[t, :, 2 * H:] = d_r, d_z, d_n
            grad_hidden_gates[t, :, : 2 * H] = grad_input_gates[t, :, : 2 * H]
            grad_hidden_gates[t, :, 2 * H:] = d_n * r
            dh = torch.addmm(dh * z, grad_hidden_gates[t], weight_hh)  # (B, 3H) @ (3H, H)
        flat_grad = grad_hidden_gates.view(T * B, 3 * H)
        grad_weight = flat_grad.t() @ previous.reshape(T * B, H)  # (3H, H), one matmul for all steps
        return grad_input_gates, dh, grad_weight, flat_grad.sum(0)


class GRULayer(nn.Module):
    """One GRU layer, time-major, optionally conditioned at every step on a fixed vector (Kiros et al. eqs. 5-8).

    The conditioning vector enters the input side of all three gates through its own matrix; since it is the same at
    every step, its projection is computed once per sentence and broadcast over time (not concatenated to every
    input, which would repeat that matmul T times)."""

    def __init__(self, input_size: int, hidden_size: int, context_size: int = 0):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(input_size, 3 * hidden_size)  # W_r, W_z, W (stacked) and the gate biases
        # C_r, C_z, C
        self.context_proj = nn.Linear(context_size, 3 * hidden_size, bias=False) if context_size else None
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))  # U_r, U_z, U
        self.bias_hh = nn.Parameter(torch.zeros(3 * hidden_size))
        self.reset_recurrent()

    def reset_recurrent(self) -> None:
        """Each (H, H) gate block of the recurrent matrix orthogonal (Kiros et al. sec. 3). Done here, not only by the
        model, so that an encoder built on its own never runs on torch.empty's uninitialised memory (NaN at times)."""
        for gate in self.weight_hh.data.chunk(3, dim=0):
            nn.init.orthogonal_(gate)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """x (T, B, I), context (B, C) or None -> hidden states (T, B, H), starting from h_0 = 0."""
        gates = self.input_proj(x)  # (T, B, 3H), one matmul over all steps
        if self.context_proj is not None:
            gates = gates + self.context_proj(context).unsqueeze(0)  # (1, B, 3H) broadcast over T
        # Under autocast (bf16-mixed) the gates come out in bf16; the loop runs in that dtype throughout, since
        # autocast is off in the hand-written backward and it could not mix dtypes there.
        h0 = gates.new_zeros(x.shape[1], self.hidden_size)
        return GRURecurrence.apply(gates, h0, self.weight_hh.to(gates.dtype), self.bias_hh.to(gates.dtype))


# -----------------------------------------------------------------------------
# Encoders


def last_states(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The state after each sentence's last real token: states (T, B, H), lengths (B,) -> (B, H).

    Padding comes after the last token, so the steps run on it never reach the returned state."""
    return states[lengths - 1, torch.arange(states.shape[1], device=states.device)]


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence within its own length, padding left in place: x (T, B, ...), lengths (B,).

    [a b c <pad>] -> [c b a <pad>]; flipping the whole time axis would instead start the sentence with padding."""
    T = x.shape[0]
    steps = torch.arange(T, device=x.device).unsqueeze(1)  # (T, 1)
    source = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (T, B)
    return x.gather(0, source.view(T, -1, *([1] * (x.dim() - 2))).expand_as(x))


class UniSkipEncoder(nn.Module):
    """uni-skip: the last state of one GRU over the sentence."""

    def __init__(self, config: SkipThoughtConfig):
        super().__init__()
        self.gru = GRULayer(config.embedding_dim, config.encoder_dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return last_states(self.gru(x), lengths)  # (B, D)


class BiSkipEncoder(nn.Module):
    """bi-skip: a GRU over the sentence and a second GRU (own parameters) over the reversed sentence, each D/2,
    last states concatenated (Kiros et al. sec. 3)."""

    def __init__(self, config: SkipThoughtConfig):
        super().__init__()
        self.forward_gru = GRULayer(config.embedding_dim, config.encoder_dim // 2)
        self.backward_gru = GRULayer(config.embedding_dim, config.encoder_dim // 2)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        forward_last = last_states(self.forward_gru(x), lengths)  # (B, D/2)
        backward_last = last_states(self.backward_gru(reverse_padded(x, lengths)), lengths)  # (B, D/2)
        return torch.cat([forward_last, backward_last], dim=1)  # (B, D)


def make_encoder(config: SkipThoughtConfig) -> nn.Module:
    return UniSkipEncoder(config) if config.encoder == "uni" else BiSkipEncoder(config)


def initialise(model: nn.Module, init_range: float) -> None:
    """Kiros et al. sec. 3: recurrent matrices orthogonal, biases zero, every other weight ~ U(-init_range,
    init_range)."""
    for name, param in model.named_parameters():
        if name.endswith("weight_hh"):
            model.get_submodule(name.rpartition(".")[0]).reset_recurrent()
        elif name.endswith("bias") or name.endswith("bias_hh"):
            nn.init.zeros_(param)
        else:
            nn.init.uniform_(param, -init_range, init_range)


# -----------------------------------------------------------------------------
# The model


class DecoderOutput(NamedTuple):
    """Logits and targets at the real (non-padding) target positions only, flattened: (N, V) and (N,)."""
    logits: torch.Tensor
    targets: torch.Tensor


class SkipThoughtOutput(NamedTuple):
    previous: DecoderOutput
    next: DecoderOutput


class SkipThoughts(nn.Module):
    """Encoder + previous-sentence decoder + next-sentence decoder, with a shared embedding and output projection."""

    def __init__(self, config: SkipThoughtConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.encoder = make_encoder(config)
        self.previous_decoder = GRULayer(config.embedding_dim, config.decoder_dim, context_size=config.encoder_dim)
        self.next_decoder = GRULayer(config.embedding_dim, config.decoder_dim, context_size=config.encoder_dim)
        self.output = nn.Linear(config.decoder_dim, config.vocab_size)  # V, shared by both decoders
        self.reset_parameters()

    def reset_parameters(self) -> None:
        initialise(self, self.config.init_range)

    def encode_embedded(self, embedded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Sentence vectors from word vectors: embedded (B, T, E), lengths (B,) -> (B, D).

        For vocabulary expansion (data_prep.corpus.word_vectors), where words the encoder never saw get vectors mapped
        from a larger word-vector space instead of a row of `self.embedding`."""
        return self.encoder(embedded.transpose(0, 1), lengths)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Sentence vectors: right-padded ids (B, T) ending in <eos>, lengths (B,) counting the <eos> -> (B, D)."""
        return self.encoder(self.embedding(ids.t()), lengths)  # (T, B, E) in

    def decode(self, decoder: GRULayer, thought: torch.Tensor, ids: torch.Tensor,
               lengths: torch.Tensor) -> DecoderOutput:
        """Teacher-forced decoding of the target sentence ids (B, T) conditioned on thought (B, D)."""
        targets = ids.t()  # (T, B)
        embedded = self.embedding(targets)  # (T, B, E)
        # Input at step t is the embedding of target word t-1; step 0 gets zeros (no <bos>), as in the authors' code.
        inputs = F.pad(embedded[:-1], (0, 0, 0, 0, 1, 0))  # (T, B, E)
        states = decoder(inputs, thought)  # (T, B, H)
        real = torch.arange(targets.shape[0], device=ids.device).unsqueeze(1) < lengths  # (T, B)
        # The vocabulary projection is most of the FLOPs: run it on real positions only.
        return DecoderOutput(self.output(states[real]), targets[real])  # (N, V), (N,)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, previous_ids: torch.Tensor,
                previous_lengths: torch.Tensor, next_ids: torch.Tensor,
                next_lengths: torch.Tensor) -> SkipThoughtOutput:
        thought = self.encode(ids, lengths)  # (B, D)
        return SkipThoughtOutput(self.decode(self.previous_decoder, thought, previous_ids, previous_lengths),
                                 self.decode(self.next_decoder, thought, next_ids, next_lengths))


def stack_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right-padded ids (B1, T1) and (B2, T2) as one batch (B1 + B2, max(T1, T2)), padded with id 0: one encoder pass
    over both, whose steps past a sentence's length never reach its last state."""
    T = max(a.shape[1], b.shape[1])
    return torch.cat([F.pad(a, (0, T - a.shape[1])), F.pad(b, (0, T - b.shape[1]))])


class QuickThoughts(nn.Module):
    """Quick-Thoughts (Logeswaran & Lee 2018, sec. 3): encoder f reads the sentence, encoder g (same architecture, own
    parameters) each candidate context sentence; one word embedding table feeds both. Trained on triples (s_{i-1},
    s_i, s_{i+1}): the candidates of every sentence are the batch's previous and next sentences, its own two among
    them (the paper's context window of +-1)."""

    def __init__(self, config: SkipThoughtConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.encoder = make_encoder(config)  # f
        self.context_encoder = make_encoder(config)  # g
        initialise(self, config.init_range)

    def encode_embedded(self, embedded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The paper's sentence vector [f(s); g(s)] from word vectors: embedded (B, T, E), lengths (B,) -> (B, 2D)."""
        x = embedded.transpose(0, 1)  # (T, B, E)
        return torch.cat([self.encoder(x, lengths), self.context_encoder(x, lengths)], dim=1)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[f(s); g(s)]: right-padded ids (B, T) ending in <eos>, lengths (B,) -> (B, 2D)."""
        return self.encode_embedded(self.embedding(ids), lengths)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, previous_ids: torch.Tensor,
                previous_lengths: torch.Tensor, next_ids: torch.Tensor, next_lengths: torch.Tensor) -> torch.Tensor:
        """Scores (B, 2B): f(s_i)·g(c_j) for each sentence i and candidate j, the candidates the batch's previous
        sentences then its next ones, so sentence i's true context is at columns i and B + i."""
        sentences = self.encoder(self.embedding(ids.t()), lengths)  # (B, D)
        candidate_ids = stack_padded(previous_ids, next_ids)  # (2B, T)
        candidates = self.context_encoder(self.embedding(candidate_ids.t()),
                                          torch.cat([previous_lengths, next_lengths]))  # (2B, D)
        return sentences @ candidates.t()  # (B, 2B)


def skip_thought_model(config: SkipThoughtConfig) -> SkipThoughts | QuickThoughts:
    """The model `config.objective` trains: Skip-Thought's encoder and decoders, or Quick-Thoughts' f and g."""
    return SkipThoughts(config) if config.objective == "skip_thought" else QuickThoughts(config)


class CombineSkip(nn.Module):
    """combine-skip: a uni-skip and a bi-skip model trained separately, their vectors concatenated (Kiros et al. sec.
    3: 4800-d at paper size). Both must read the same word ids, i.e. share one vocabulary file."""

    def __init__(self, uni_skip: SkipThoughts | QuickThoughts, bi_skip: SkipThoughts | QuickThoughts):
        super().__init__()
        if uni_skip.config.encoder != "uni" or bi_skip.config.encoder != "bi":
            raise ValueError(f"combine-skip needs a uni-skip and a bi-skip model, got {uni_skip.config.encoder!r} "
                             f"and {bi_skip.config.encoder!r}")
        if uni_skip.config.vocab_size != bi_skip.config.vocab_size:
            raise ValueError("the uni-skip and bi-skip models have different vocabulary sizes; train both with the "
                             "same word vocabulary")
        self.uni_skip, self.bi_skip = uni_skip, bi_skip

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.uni_skip.encode(ids, lengths), self.bi_skip.encode(ids, lengths)], dim=1)  # (B, 2D)


class SkipThoughtClassifier(nn.Module):
    """The paper's downstream use (Kiros et al. sec. 3): no fine-tuning, a linear model on features of the frozen
    vectors: a sentence's vector u, or a pair's [|u - v|, u * v] (sec. 3.1 and 3.2, after Tai et al. 2015), composed by
    the caller. One output regresses a score. The features are standardised with statistics of the training split
    (`mean`, `scale`, set by the caller) as the SentEval probes do: the vectors' coordinates differ in scale by orders
    of magnitude, which a linear model trained by gradient steps would otherwise feel as ill-conditioning."""

    def __init__(self, num_features: int, num_outputs: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(num_features))
        self.register_buffer("scale", torch.ones(num_features))
        self.classifier = nn.Linear(num_features, num_outputs)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier((features - self.mean) / self.scale)  # (B, F) -> (B, num_outputs)


# -----------------------------------------------------------------------------
# Checkpoint I/O


def save_pretrained(model: SkipThoughts | QuickThoughts, path) -> None:
    """Write the model to directory `path` (config.json + model.safetensors); read back with load_pretrained."""
    save_checkpoint(model, path, CHECKPOINT_FORMAT)


def load_pretrained(path) -> SkipThoughts | QuickThoughts:
    """The model save_pretrained wrote, of the class its config's objective names (a checkpoint without one is
    Skip-Thought's)."""
    return load_checkpoint(path, skip_thought_model, SkipThoughtConfig, CHECKPOINT_FORMAT)
