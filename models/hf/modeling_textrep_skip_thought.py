"""Skip-Thought's sentence encoder (Kiros et al. 2015) as textrep trains it, for transformers: AutoModel with
trust_remote_code=True.

This file is copied beside the weights of every exported textrep Skip-Thought model and imports only torch and
transformers, so the directory works without textrep installed. It holds the encoder alone: the word embeddings and
the GRU (uni-skip), or the forward GRU and the GRU over the reversed sentence (bi-skip); the two decoders that trained
it are not exported. A Quick-Thoughts model (Logeswaran & Lee 2018; `objective`) holds its two encoders f and g, and
its vector is theirs concatenated, [f(s); g(s)]. The computation is textrep's models/skip_thought.py written out
plainly (a Python loop over time steps instead of its hand-written backward); textrep's tests compare the outputs of a
loaded directory with its own.

Inputs: the word ids of its tokenizer, which appends <eos> to every sentence as the model was trained; right padding,
told by the attention mask. Outputs: `pooler_output` (B, encoder_dim) is the Skip-Thought vector, the state after the
sentence's <eos>; `last_hidden_state` (B, T, encoder_dim) the encoder's state at every token (bi-skip: the forward
GRU's and, aligned to the same token, the backward GRU's), zero at padding; Quick-Thoughts: f's then g's, each
twice encoder_dim wide.
"""
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling


class TextrepSkipThoughtConfig(PretrainedConfig):
    model_type = "textrep_skip_thought"

    vocab_size: int = 20000
    embedding_dim: int = 620
    encoder_dim: int = 2400  # the vector's size; bi-skip: two GRUs of half of it
    encoder: str = "uni"  # "uni" or "bi"
    objective: str = "skip_thought"  # "quick_thought": two encoders, f and g, their vectors concatenated
    pad_token_id: int | None = 0


class TextrepGRU(nn.Module):
    """One GRU layer in textrep's layout (gates r, z, n as nn.GRU orders them), from a zero state."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(input_size, 3 * hidden_size)
        self.weight_hh = nn.Parameter(torch.zeros(3 * hidden_size, hidden_size))
        self.bias_hh = nn.Parameter(torch.zeros(3 * hidden_size))

    def forward(self, x):
        """x (T, B, I) -> states (T, B, H)."""
        H = self.hidden_size
        gates = self.input_proj(x)
        h = x.new_zeros(x.size(1), H)
        states = []
        for t in range(x.size(0)):
            gh = torch.addmm(self.bias_hh, h, self.weight_hh.t())
            rz = (gates[t, :, : 2 * H] + gh[:, : 2 * H]).sigmoid()
            r, z = rz[:, :H], rz[:, H:]
            n = (gates[t, :, 2 * H:] + r * gh[:, 2 * H:]).tanh()
            h = n + z * (h - n)  # (1 - z) n + z h
            states.append(h)
        return torch.stack(states)


def reverse_padded(x, lengths):
    """Each sequence of x (T, B, ...) reversed within its own length, the padding left where it is."""
    steps = torch.arange(x.size(0), device=x.device)[:, None]
    source = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (T, B)
    return x.gather(0, source.view(*source.shape, *([1] * (x.dim() - 2))).expand_as(x))


class TextrepUniSkipEncoder(nn.Module):
    def __init__(self, config: TextrepSkipThoughtConfig):
        super().__init__()
        self.gru = TextrepGRU(config.embedding_dim, config.encoder_dim)

    def forward(self, x, lengths):
        return self.gru(x)


class TextrepBiSkipEncoder(nn.Module):
    def __init__(self, config: TextrepSkipThoughtConfig):
        super().__init__()
        self.forward_gru = TextrepGRU(config.embedding_dim, config.encoder_dim // 2)
        self.backward_gru = TextrepGRU(config.embedding_dim, config.encoder_dim // 2)

    def forward(self, x, lengths):
        backward = reverse_padded(self.backward_gru(reverse_padded(x, lengths)), lengths)  # back in reading order
        return torch.cat([self.forward_gru(x), backward], dim=-1)


class TextrepSkipThoughtModel(PreTrainedModel):
    config_class = TextrepSkipThoughtConfig

    def __init__(self, config: TextrepSkipThoughtConfig):
        super().__init__(config)
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_dim)
        encoder = TextrepUniSkipEncoder if config.encoder == "uni" else TextrepBiSkipEncoder
        self.encoder = encoder(config)
        self.context_encoder = encoder(config) if config.objective == "quick_thought" else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embedding

    def set_input_embeddings(self, value):
        self.embedding = value

    def forward(self, input_ids, attention_mask=None, return_dict=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(1)  # (B,): real tokens, <eos> included; the padding follows them
        embedded = self.embedding(input_ids.t())
        encoders = [self.encoder] + ([self.context_encoder] if self.context_encoder is not None else [])
        outputs = [self._encode(encoder, embedded, lengths) for encoder in encoders]
        hidden = torch.cat([states for states, _ in outputs], dim=-1).transpose(0, 1)
        hidden = hidden * attention_mask[..., None].to(hidden.dtype)
        return BaseModelOutputWithPooling(last_hidden_state=hidden,
                                          pooler_output=torch.cat([vector for _, vector in outputs], dim=-1))

    def _encode(self, encoder, embedded, lengths):
        """One encoder's states (T, B, D) and its sentence vectors (B, D)."""
        states = encoder(embedded, lengths)
        batch = torch.arange(embedded.size(1), device=embedded.device)
        if self.config.encoder == "uni":
            return states, states[lengths - 1, batch]
        # the forward GRU after the last token, the backward GRU after the first (read last)
        half = self.config.encoder_dim // 2
        return states, torch.cat([states[lengths - 1, batch, :half], states[0, :, half:]], dim=-1)
