"""
The RNN encoder-decoder with attention (seed 001) in one file of plain PyTorch: a bidirectional GRU or LSTM reads the
source, and a GRU or LSTM decoder writes the target, attending at every step over the encoder's states.

Read top to bottom: config -> attention scores -> encoder -> decoder -> RNNEncoderDecoder -> decoding state ->
checkpoint I/O. Greedy, sampling and beam search are models/generation.py's, shared with the Transformers.

The decoder is Luong et al. 2015's global attention model: at step t the RNN reads the previous target token (and,
with input feeding, the previous attentional state h~_{t-1}, their Sec. 3.3), its output h_t queries the encoder
states h_s, and h~_t = tanh(W_c [c_t; h_t]) over the context c_t predicts the token. Attention scores:
    additive   v^T tanh(W_q h_t + W_k h_s)   Bahdanau et al. 2015 (Luong's "concat")
    dot        h_t^T h_s                      Luong et al. 2015
    general    h_t^T W_a h_s                  Luong et al. 2015
Seed 001 (d2l) feeds the context into the decoder RNN's input, which is what input feeding does with h~; Bahdanau et
al. query with the previous state h_{t-1} instead of h_t. Without input feeding the decoder RNN runs over the whole
target in one call in training (no step depends on an attention result), which is faster.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.checkpoint import load_checkpoint, save_checkpoint
from models.seq2seq import LabelSmoothing, PointerGenerator, Seq2SeqOutput, decoder_start, last_position, pad_sources

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}
ATTENTIONS = ("additive", "dot", "general")


@dataclass
class RNNSeq2SeqConfig:
    vocab_size: int = 32000  # one vocabulary for source and target: the embeddings are shared, and are the output layer
    embedding_dim: int = 256  # also the width of the attentional state h~, which the tied output layer reads
    # The decoder's state width. Each encoder direction has half of it, so an encoder state (both directions
    # concatenated) is as wide as a decoder state, as dot attention needs, and the encoder's last states in both
    # directions, concatenated, are the decoder's first state
    hidden_size: int = 512
    num_layers: int = 2  # of the encoder and of the decoder
    cell: str = "lstm"  # "gru" (Bahdanau et al.; seed 001's d2l) or "lstm" (Luong et al.)
    attention: str = "additive"  # ATTENTIONS
    input_feeding: bool = True  # Luong et al. Sec. 3.3: the decoder RNN also reads h~_{t-1}
    dropout: float = 0.1  # on embeddings, between RNN layers and on h~ (Luong et al. used 0.2 with 4 layers)
    init_range: float = 0.1  # every parameter ~ U(-0.1, 0.1) (Sutskever et al. 2014; Luong et al. 2015)
    pad_token_id: int = 0
    decoder_start_token_id: int = 1
    eos_token_id: int | None = 2
    label_smoothing: float = 0.0  # LabelSmoothing's eps in training mode (none in the RNN papers)
    # See et al. 2017's pointer-generator (models.seq2seq.PointerGenerator) on the decoder's attention: the output also
    # copies source tokens, for targets that repeat words of their source (headlines, names, numbers)
    copy_attention: bool = False
    # Not read by the model (an RNN has no positions): the longest source and target the pipeline pretrained it on,
    # to which fine-tuning and the frozen encoder cut theirs as they do to the Transformer's max_positions, so the two
    # read the same text. None: no limit
    max_positions: int | None = None

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {sorted(CELLS)}, got {self.cell!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.hidden_size % 2 != 0:
            raise ValueError(f"hidden_size must be even (half per encoder direction), got {self.hidden_size}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} {value} is outside the vocabulary of {self.vocab_size}")


RNN_SEQ2SEQ_SIZES: dict[str, dict] = {
    "rnn_attn_tiny": dict(embedding_dim=64, hidden_size=128, num_layers=1),
    "rnn_attn_small": dict(embedding_dim=256, hidden_size=512, num_layers=2),
}


def rnn_seq2seq_config(name: str, **overrides) -> RNNSeq2SeqConfig:
    """The named size from RNN_SEQ2SEQ_SIZES with any RNNSeq2SeqConfig field overridden."""
    if name not in RNN_SEQ2SEQ_SIZES:
        raise KeyError(f"unknown RNN seq2seq size {name!r}; known: {sorted(RNN_SEQ2SEQ_SIZES)}")
    return RNNSeq2SeqConfig(**{**RNN_SEQ2SEQ_SIZES[name], **overrides})


# -----------------------------------------------------------------------------
# Attention


class Memory(NamedTuple):
    """The encoder's output as the decoder reads it at every step."""
    keys: torch.Tensor  # (B, S, H): the encoder states as scored (projected once per source for additive, general)
    values: torch.Tensor  # (B, S, H): the encoder states
    mask: torch.Tensor  # (B, S), True = source token
    input_ids: torch.Tensor  # (B, S): the source's ids, what copy_attention copies


class Attention(nn.Module):
    """Scores of a query h_t against every encoder state h_s (ATTENTIONS), softmax over the source's tokens, and the
    context c_t = sum_s a_ts h_s. A memory of one source serves any number of query rows (the beams of beam search) by
    broadcasting."""

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        H, self.kind = config.hidden_size, config.attention
        if self.kind == "additive":
            self.query = nn.Linear(H, H, bias=False)
            self.key = nn.Linear(H, H)
            self.v = nn.Linear(H, 1, bias=False)
        elif self.kind == "general":
            self.key = nn.Linear(H, H, bias=False)  # h_t^T (W_a h_s): W_a applied to the states once per source

    def keys(self, states: torch.Tensor) -> torch.Tensor:
        return states if self.kind == "dot" else self.key(states)  # (B, S, H)

    def forward(self, query: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, T, H) -> context (B, T, H) and the attention probabilities (B, T, S), zero at padding."""
        if self.kind == "additive":
            hidden = torch.tanh(self.query(query)[:, :, None] + memory.keys[:, None])  # (B, T, S, H)
            scores = self.v(hidden).squeeze(-1)  # (B, T, S)
        else:
            scores = query @ memory.keys.transpose(1, 2)  # (B, T, S)
        weights = scores.masked_fill(~memory.mask[:, None], float("-inf")).softmax(-1)
        return weights @ memory.values, weights


# -----------------------------------------------------------------------------
# Encoder and decoder


class Encoder(nn.Module):
    """A bidirectional RNN over the embedded source; padding is skipped (packed sequences), so the backward direction
    starts at each source's last real token."""

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.rnn = CELLS[config.cell](config.embedding_dim, config.hidden_size // 2, config.num_layers,
                                      batch_first=True, bidirectional=True,
                                      dropout=config.dropout if config.num_layers > 1 else 0.0)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor):
        """x (B, S, E), attention_mask (B, S) -> the states (B, S, H), zero at padding, and the final state in the
        decoder's layout: (num_layers, B, H) per tensor of the cell's state, the two directions concatenated."""
        lengths = attention_mask.sum(1)
        padded = not bool(attention_mask.all())
        if padded:
            x = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, final = self.rnn(x)
        if padded:
            states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=attention_mask.size(1))

        def join(h):  # (num_layers * 2, B, H/2), directions innermost -> (num_layers, B, H)
            L2, B, half = h.shape
            return h.view(L2 // 2, 2, B, half).transpose(1, 2).reshape(L2 // 2, B, 2 * half)

        return states, (tuple(join(h) for h in final) if isinstance(final, tuple) else join(final))


class Decoder(nn.Module):
    """Luong et al.'s decoder: RNN -> attention -> attentional state h~ = tanh(W_c [c; h]) (module docstring)."""

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        E, H = config.embedding_dim, config.hidden_size
        self.input_feeding = config.input_feeding
        self.rnn = CELLS[config.cell](E + (E if config.input_feeding else 0), H, config.num_layers, batch_first=True,
                                      dropout=config.dropout if config.num_layers > 1 else 0.0)
        self.attention = Attention(config)
        self.combine = nn.Linear(2 * H, E, bias=False)  # W_c, to the embedding width: the output layer is tied
        self.dropout = nn.Dropout(config.dropout)

    def attend(self, x: torch.Tensor, h: torch.Tensor, memory: Memory) -> "DecoderOutput":
        """Embedded inputs x (B, T, E) and the RNN's outputs h (B, T, H) for them -> the DecoderOutput."""
        context, attention = self.attention(h, memory)
        attentional = self.dropout(torch.tanh(self.combine(torch.cat([context, h], dim=-1))))
        return DecoderOutput(attentional, x, h, context, attention)

    def forward(self, x: torch.Tensor, memory: Memory,
                state: "DecoderState") -> tuple["DecoderOutput", "DecoderState"]:
        """The embedded target tokens x (B, T, E) after `state` -> the DecoderOutput and the state after them."""
        if not self.input_feeding:  # no step waits for an attention: the RNN runs over all T in one call
            h, rnn_state = self.rnn(x, state.rnn)
            out = self.attend(x, h, memory)
            return out, DecoderState(rnn_state, out.attentional[:, -1])
        steps = []
        for t in range(x.size(1)):
            h, rnn_state = self.rnn(torch.cat([x[:, t: t + 1], state.attentional[:, None]], dim=-1), state.rnn)
            steps.append(self.attend(x[:, t: t + 1], h, memory))
            state = DecoderState(rnn_state, steps[-1].attentional[:, 0])
        return DecoderOutput(*(torch.cat(parts, 1) for parts in zip(*steps))), state


class DecoderOutput(NamedTuple):
    """What the decoder gives for T target positions: h~, which the output layer scores, and what the
    pointer-generator reads besides (See et al.'s decoder input x_t, state s_t, context h*_t and attention a_t)."""
    attentional: torch.Tensor  # (B, T, E): h~
    inputs: torch.Tensor  # (B, T, E): the embedded target tokens
    hidden: torch.Tensor  # (B, T, H): the RNN's outputs h_t
    context: torch.Tensor  # (B, T, H): c_t
    attention: torch.Tensor  # (B, T, S): the attention probabilities


class DecoderState(NamedTuple):
    rnn: torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # the RNN's state, (num_layers, B, H) per tensor
    attentional: torch.Tensor  # (B, E): h~ of the last step, which input feeding reads (zeros before the first)


# -----------------------------------------------------------------------------
# The model


class RNNEncoderDecoder(nn.Module):
    """Encoder, decoder and the output layer: scores over the vocabulary against the shared embedding matrix (tied,
    Press & Wolf 2017) plus a bias of its own."""

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        width = 2 * config.hidden_size + config.embedding_dim  # [context; RNN output; embedded input]
        self.pointer = PointerGenerator(width) if config.copy_attention else None
        self.criterion = LabelSmoothing(config.label_smoothing)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-config.init_range, config.init_range)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding_dropout(self.shared(ids))

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> tuple[Memory, DecoderState]:
        """Source ids (B, S) and attention_mask (B, S) (1 = token, 0 = padding) -> the Memory and the decoder's first
        state."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states, final = self.encoder(self.embed(input_ids), attention_mask)
        memory = Memory(self.decoder.attention.keys(states), states, attention_mask.bool(), input_ids)
        first = DecoderState(final, states.new_zeros(input_ids.size(0), self.config.embedding_dim))
        return memory, first

    def encoder_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Source ids and attention_mask (B, S) -> the encoder's states (B, S, H), zero at padding: what the decoder
        attends to, and what a frozen sentence encoder averages (models.seq2seq.EncoderDecoder has the same method)."""
        return self.encoder(self.embed(input_ids), attention_mask)[0]

    def describe(self) -> str:
        """The architecture in a line, for a run's report."""
        c = self.config
        return (f"RNN encoder-decoder with attention (seed 001; Luong et al. 2015): bidirectional {c.cell.upper()} "
                f"encoder, {c.cell.upper()} decoder, {c.num_layers} + {c.num_layers} layers, hidden {c.hidden_size}, "
                f"embeddings {c.embedding_dim}, {c.attention} attention"
                + (", input feeding" if c.input_feeding else "") + (", copy attention" if c.copy_attention else ""))

    def scores(self, out: DecoderOutput, memory: Memory) -> torch.Tensor:
        """The decoder's output for T positions -> scores (B, T, V) of the next token at each: the output layer's
        logits, or with copy_attention the pointer-generator's log-probabilities."""
        logits = F.linear(out.attentional, self.shared.weight, self.output_bias)
        if self.pointer is None:
            return logits
        return self.pointer(logits, torch.cat([out.context, out.hidden, out.inputs], dim=-1), out.attention,
                            memory.input_ids)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> Seq2SeqOutput:
        """The arguments and result of models.seq2seq.EncoderDecoder.forward."""
        memory, state = self.encode(input_ids, attention_mask)
        out, _ = self.decoder(self.embed(decoder_input_ids), memory, state)
        logits = self.scores(out, memory)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = self.criterion(logits.flatten(0, 1), targets.flatten(), smoothed=self.training)
        return Seq2SeqOutput(logits, loss)

    def start_decoding(self, sources, max_new_tokens: int, num_rows: int):
        """The decoding state of the source token lists `sources` for models/generation.py, and the first tokens to
        feed it (the decoder start token). An RNN's state has no length to allocate: num_rows is not needed."""
        input_ids, attention_mask = pad_sources(sources, self.config.pad_token_id, self.shared.weight.device)
        return RNNDecoding(self, *self.encode(input_ids, attention_mask)), decoder_start(
            len(sources), self.config.decoder_start_token_id, input_ids.device)


class RNNDecoding:
    """A batch of targets being decoded (the Decoding of models/generation.py): the decoder's state is all the past."""

    def __init__(self, model: RNNEncoderDecoder, memory: Memory, state: DecoderState):
        self.model, self.memory, self.state = model, memory, state
        self.eos_token_id = model.config.eos_token_id

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        out, self.state = self.model.decoder(self.model.embed(tokens), self.memory, self.state)
        return self.model.scores(last_position(out), self.memory)[:, 0]  # (B, V)

    def reorder(self, rows: torch.Tensor) -> None:
        # the beams of one source share its Memory (broadcast in Attention), so only the decoder's state moves
        rnn = self.state.rnn
        rnn = tuple(h[:, rows] for h in rnn) if isinstance(rnn, tuple) else rnn[:, rows]
        self.state = DecoderState(rnn, self.state.attentional[rows])


# -----------------------------------------------------------------------------
# Checkpoint I/O: config.json (RNNSeq2SeqConfig fields + "format") and model.safetensors

CHECKPOINT_FORMAT = "textrep-rnn-seq2seq"


def save_pretrained(model: RNNEncoderDecoder, path) -> None:
    save_checkpoint(model, path, CHECKPOINT_FORMAT)


def load_pretrained(path) -> RNNEncoderDecoder:
    return load_checkpoint(Path(path), RNNEncoderDecoder, RNNSeq2SeqConfig, CHECKPOINT_FORMAT)
