"""ELMo's biLM (Peters et al. 2018) as textrep trains it, for transformers: AutoModel with trust_remote_code=True.

This file is copied beside the weights of every exported textrep ELMo and imports only torch and transformers, so
the directory works without textrep installed. It holds the biLM's representation layers: the context-free token
layer (a character CNN over each word's UTF-8 bytes, or a word embedding) and the forward and backward LSTM stacks; the
softmax that trained them is not exported. The computation is textrep's models/elmo.py written out plainly (nn.LSTM
with projections, nn.functional.conv1d); textrep's tests compare the outputs of a loaded directory with its own.

Inputs: the ids of its tokenizer, which splits text into words as textrep does (BERT's whitespace and punctuation
split, case kept) and wraps the sentence in <S> ... </S>. For the character CNN every byte of a word is a token (ids
`first_byte_id + byte` for a word's first byte, `continuation_byte_id + byte` for the others, as WordPiece pieces and
"##" pieces), so any word is spelled out, never unknown; the model gathers them back into words, each cut to
max_characters_per_token - 2 bytes as in training. A word-input biLM reads one vocabulary id per word. Right padding,
told by the attention mask.

Outputs, per word of the sentence (<S> and </S> dropped; `word_mask` (B, W) marks the real ones, and a fast
tokenizer's `word_ids()` maps tokens to these words): `hidden_states`, the biLM's L + 1 layers (B, W, 2P) (the token
layer repeated for both directions, then each LSTM layer's forward and backward states), whose task-weighted sum is
the ELMo vector (eq. 1 of the paper); `last_hidden_state`, their equal-weight average (ELMo with s = 1/(L + 1), gamma =
1); `pooler_output`, its mean over the words: the sentence vector textrep's evaluate stage probes.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

# bilm-tf's character ids, each + 1 so that 0 means "no word here"
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260


class TextrepElmoConfig(PretrainedConfig):
    model_type = "textrep_elmo"

    token_encoder: str = "char_cnn"  # or "word"
    vocab_size: int = 793471  # the biLM's word vocabulary (its output layer; the input layer of a word-input biLM)
    max_characters_per_token: int = 50
    n_characters: int = 262
    char_embedding_dim: int = 16
    filters: list | None = None  # [[width, count], ...]
    num_highway_layers: int = 2
    projection_dim: int = 512
    lstm_dim: int = 4096
    num_layers: int = 2
    # the tokenizer's ids
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1  # <S>
    eos_token_id: int | None = 2  # </S>
    first_byte_id: int = 4
    continuation_byte_id: int = 260


@dataclass
class ElmoOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None  # (B, W, 2P)
    pooler_output: torch.Tensor | None = None  # (B, 2P)
    hidden_states: tuple | None = None  # L + 1 of (B, W, 2P)
    word_mask: torch.Tensor | None = None  # (B, W)


class TextrepHighway(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)

    def forward(self, x):
        nonlinear, gate = self.proj(x).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * x + (1 - gate) * F.relu(nonlinear)


class TextrepCharCNNEncoder(nn.Module):
    """Kim et al. 2016: character embeddings, convolutions max-pooled over the word, ReLU, highway, projection."""

    def __init__(self, config: TextrepElmoConfig):
        super().__init__()
        num_filters = sum(count for _, count in config.filters)
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, count, kernel_size=width)
                                          for width, count in config.filters)
        self.highways = nn.ModuleList(TextrepHighway(num_filters) for _ in range(config.num_highway_layers))
        self.projection = nn.Linear(num_filters, config.projection_dim)

    def forward(self, char_ids):
        B, T, W = char_ids.shape
        chars = self.char_embedding(char_ids.reshape(B * T, W)).transpose(1, 2)  # (B*T, E, W)
        x = torch.cat([conv(chars).amax(dim=-1) for conv in self.convolutions], dim=-1).relu()
        for highway in self.highways:
            x = highway(x)
        return self.projection(x).view(B, T, -1)


class TextrepWordEncoder(nn.Module):
    def __init__(self, config: TextrepElmoConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.projection_dim)

    def forward(self, word_ids):
        return self.embedding(word_ids)


class TextrepLstmStack(nn.Module):
    """LSTMs with projections (nn.LSTM's proj_size), each layer after the first with a residual connection."""

    def __init__(self, config: TextrepElmoConfig):
        super().__init__()
        P = config.projection_dim
        self.layers = nn.ModuleList(nn.LSTM(P, config.lstm_dim, proj_size=P, batch_first=True)
                                    for _ in range(config.num_layers))

    def forward(self, x):
        outputs = []
        for i, lstm in enumerate(self.layers):
            h, _ = lstm(x)
            x = h if i == 0 else h + x
            outputs.append(x)
        return outputs


def reversal_index(mask):
    """(B, T) index reversing each row's first mask.sum() positions, padding left in place."""
    positions = torch.arange(mask.size(1), device=mask.device)[None, :]
    lengths = mask.sum(1, keepdim=True)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)


class TextrepElmoModel(PreTrainedModel):
    config_class = TextrepElmoConfig

    def __init__(self, config: TextrepElmoConfig):
        super().__init__(config)
        char_cnn = config.token_encoder == "char_cnn"
        self.token_encoder = TextrepCharCNNEncoder(config) if char_cnn else TextrepWordEncoder(config)
        self.forward_lstm = TextrepLstmStack(config)
        self.backward_lstm = TextrepLstmStack(config)
        self.post_init()

    def words(self, input_ids, attention_mask):
        """The tokens gathered into words: the token layer's input (B, W, max_chars) character ids, or (B, W) word
        ids, and the mask (B, W) of the real words, <S> and </S> included."""
        c = self.config
        real = attention_mask.bool()
        if c.token_encoder != "char_cnn":
            return input_ids.masked_fill(~real, 0), real
        first = (input_ids >= c.first_byte_id) & (input_ids < c.first_byte_id + 256)
        later = (input_ids >= c.continuation_byte_id) & (input_ids < c.continuation_byte_id + 256)
        marker = (input_ids == c.bos_token_id) | (input_ids == c.eos_token_id)
        starts, later = (first | marker) & real, later & real
        B, N = input_ids.shape
        word = starts.long().cumsum(1) - 1  # (B, N): the word each token belongs to
        positions = torch.arange(N, device=input_ids.device).expand(B, N)
        offset = positions - (positions * starts).cummax(1).values  # 0 at a word's first token, k at its k-th later
        value = torch.where(first, input_ids - c.first_byte_id, input_ids - c.continuation_byte_id)
        value = torch.where(input_ids == c.bos_token_id, BOS_CHAR, torch.where(input_ids == c.eos_token_id, EOS_CHAR,
                                                                                  value))
        width = c.max_characters_per_token
        kept = (starts | later) & (offset < width - 2)  # bytes cut to width - 2, as textrep cuts them
        num_words = starts.sum(1)  # (B,)
        W = int(num_words.max()) if B else 0
        word_mask = torch.arange(W, device=input_ids.device)[None, :] < num_words[:, None]  # (B, W)
        chars = torch.where(word_mask[..., None], PAD_CHAR + 1, 0).expand(B, W, width).clone()  # (B, W, width)
        chars[..., 0] = torch.where(word_mask, BOW_CHAR + 1, 0)
        rows = torch.arange(B, device=input_ids.device)[:, None].expand(B, N)
        chars[rows[kept], word[kept], offset[kept] + 1] = value[kept] + 1
        lengths = torch.zeros(B, W, dtype=torch.long, device=input_ids.device)
        lengths.index_put_((rows[kept], word[kept]), torch.ones_like(word[kept]), accumulate=True)
        ends = word_mask.nonzero(as_tuple=True)
        chars[ends[0], ends[1], lengths[ends] + 1] = EOW_CHAR + 1
        return chars, word_mask

    def forward(self, input_ids, attention_mask=None, return_dict=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        inputs, mask = self.words(input_ids, attention_mask)
        x = self.token_encoder(inputs)  # (B, W, P)
        index = reversal_index(mask)[:, :, None].expand_as(x)
        forward_layers = self.forward_lstm(x)
        backward_layers = self.backward_lstm(x.gather(1, index))  # each sentence read from its end
        layers = [torch.cat([x, x], -1)] + [torch.cat([f, b.gather(1, index)], -1)
                                            for f, b in zip(forward_layers, backward_layers)]
        word_mask = mask[:, 2:]  # a sentence of n words fills n + 2 positions, the words at 1..n
        keep = word_mask[..., None].to(x.dtype)
        layers = tuple(layer[:, 1:-1] * keep for layer in layers)
        mixed = torch.stack(layers).mean(0)
        sentence = (mixed * keep).sum(1) / keep.sum(1).clamp(min=1)
        return ElmoOutput(last_hidden_state=mixed, pooler_output=sentence, hidden_states=layers, word_mask=word_mask)
