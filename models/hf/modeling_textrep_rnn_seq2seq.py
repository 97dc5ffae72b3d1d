"""textrep's RNN encoder-decoder with attention (seed 001; Luong et al. 2015) for transformers:
AutoModelForSeq2SeqLM with trust_remote_code=True.

This file is copied beside the weights of every exported textrep RNN encoder-decoder and imports only torch and
transformers, so the directory works without textrep installed. The computation is textrep's models/rnn_seq2seq.py
written out plainly, with its parameter names: a bidirectional GRU or LSTM over the source, whose last states in both
directions are the decoder's first state; a GRU or LSTM decoder whose output h_t queries the encoder's states (additive,
dot or general attention), h~_t = tanh(W_c [c_t; h_t]) (fed back into the next step's input with input feeding), and
logits against the shared embeddings plus a bias; with copy_attention, See et al. 2017's pointer-generator mixes
copying from the source into them (TextrepPointerGenerator). textrep's tests compare the logits of a loaded directory
with its own.

Inputs: the source ids of its tokenizer followed by the end token, as the model was trained (right padding, told by
the attention mask), and the decoder's input, which starts with decoder_start_token_id. Outputs: the logits of the
next target token at each decoder position (with copy_attention, the mixture's log-probabilities, their own
log_softmax). `generate` decodes (greedy, sampling or beam search) by running the decoder over the whole prefix at
every step: the model keeps no cache.
"""
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import ModelOutput

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


class TextrepRNNSeq2SeqConfig(PretrainedConfig):
    model_type = "textrep_rnn_seq2seq"

    def __init__(self, vocab_size=32000, embedding_dim=256, hidden_size=512, num_layers=2, cell="lstm",
                 attention="additive", input_feeding=True, copy_attention=False, max_positions=None, pad_token_id=0,
                 decoder_start_token_id=1, eos_token_id=2, **kwargs):
        self.vocab_size, self.embedding_dim, self.hidden_size = vocab_size, embedding_dim, hidden_size
        self.num_layers, self.cell, self.attention = num_layers, cell, attention
        self.input_feeding, self.copy_attention, self.max_positions = input_feeding, copy_attention, max_positions
        super().__init__(pad_token_id=pad_token_id, decoder_start_token_id=decoder_start_token_id,
                         eos_token_id=eos_token_id, **{**kwargs, "is_encoder_decoder": True})


@dataclass
class TextrepRNNEncoderOutput(ModelOutput):
    """The encoder's states (B, S, H), its last states in the decoder's layout, and the source's ids (B, S), which the
    pointer-generator copies, all batch first so that `generate` repeats them per beam: final_state is (B, 1 for a GRU
    or 2 for an LSTM's (h, c), num_layers, H)."""
    last_hidden_state: torch.Tensor = None
    final_state: torch.Tensor = None
    source_ids: torch.Tensor = None


class TextrepAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        H, self.kind = config.hidden_size, config.attention
        if self.kind == "additive":
            self.query, self.key, self.v = nn.Linear(H, H, bias=False), nn.Linear(H, H), nn.Linear(H, 1, bias=False)
        elif self.kind == "general":
            self.key = nn.Linear(H, H, bias=False)

    def forward(self, query, states, mask):
        """query (B, T, H) over the encoder's states (B, S, H), mask (B, S) True = token -> context (B, T, H) and the
        attention probabilities (B, T, S), zero at padding."""
        keys = states if self.kind == "dot" else self.key(states)
        if self.kind == "additive":
            scores = self.v(torch.tanh(self.query(query)[:, :, None] + keys[:, None])).squeeze(-1)
        else:
            scores = query @ keys.transpose(1, 2)
        weights = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
        return weights @ states, weights


class TextrepEncoder(nn.Module):
    main_input_name = "input_ids"  # what `generate` asks of a model's `encoder`

    def __init__(self, config):
        super().__init__()
        self.rnn = CELLS[config.cell](config.embedding_dim, config.hidden_size // 2, config.num_layers,
                                      batch_first=True, bidirectional=True)

    def forward(self, x, attention_mask):
        packed = nn.utils.rnn.pack_padded_sequence(x, attention_mask.sum(1).cpu(), batch_first=True,
                                                   enforce_sorted=False)
        states, final = self.rnn(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=attention_mask.size(1))
        finals = final if isinstance(final, tuple) else (final,)
        # (num_layers * 2, B, H/2), directions innermost -> (B, num_layers, H), both directions side by side
        joined = [h.view(h.size(0) // 2, 2, *h.shape[1:]).permute(2, 0, 1, 3).flatten(2) for h in finals]
        return states, torch.stack(joined, 1)


class TextrepDecoderOutput(NamedTuple):
    """Per target position: h~, which the output layer scores, and what the pointer-generator reads besides."""
    attentional: torch.Tensor  # (B, T, E): h~
    hidden: torch.Tensor  # (B, T, H): the RNN's outputs h_t
    context: torch.Tensor  # (B, T, H): c_t
    attention: torch.Tensor  # (B, T, S): the attention probabilities


class TextrepDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        E, H = config.embedding_dim, config.hidden_size
        self.input_feeding = config.input_feeding
        self.rnn = CELLS[config.cell](E + (E if config.input_feeding else 0), H, config.num_layers, batch_first=True)
        self.attention = TextrepAttention(config)
        self.combine = nn.Linear(2 * H, E, bias=False)

    def attend(self, h, states, mask):
        context, attention = self.attention(h, states, mask)
        return TextrepDecoderOutput(torch.tanh(self.combine(torch.cat([context, h], dim=-1))), h, context, attention)

    def forward(self, x, states, mask, final_state):
        rnn_state = final_state.permute(1, 2, 0, 3).contiguous()  # (1 or 2, num_layers, B, H)
        rnn_state = tuple(rnn_state) if isinstance(self.rnn, nn.LSTM) else rnn_state[0]
        if not self.input_feeding:
            return self.attend(self.rnn(x, rnn_state)[0], states, mask)
        attentional, steps = x.new_zeros(x.size(0), x.size(2)), []
        for t in range(x.size(1)):
            h, rnn_state = self.rnn(torch.cat([x[:, t: t + 1], attentional[:, None]], dim=-1), rnn_state)
            steps.append(self.attend(h, states, mask))
            attentional = steps[-1].attentional[:, 0]
        return TextrepDecoderOutput(*(torch.cat(parts, 1) for parts in zip(*steps)))


class TextrepPointerGenerator(nn.Module):
    """See et al. 2017's pointer-generator over the vocabulary that source and target share: a gate
    p_gen = sigmoid(w . features + b) mixes the vocabulary distribution with the attention over the source scattered
    onto the source's ids, P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{s: x_s = w} a_s (a repeated token gets each of
    its shares; padding has zero attention, so none). modeling_textrep_seq2seq.py has the same class: each file is
    copied alone beside its weights and imports only torch and transformers, and tests/seq2seq/test_seq2seq_export.py
    holds both to models/seq2seq.py's PointerGenerator."""

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


class TextrepRNNSeq2SeqEncoder:
    """The source's ids -> the encoder's output: what `generate` runs once per source (get_encoder). Not a module of
    its own: the embeddings and the encoder are the model's, under textrep's names."""

    main_input_name = "input_ids"

    def __init__(self, model):
        self.model = model

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states, final = self.model.encoder(self.model.shared(input_ids), attention_mask)
        return TextrepRNNEncoderOutput(last_hidden_state=states, final_state=final, source_ids=input_ids)

    __call__ = forward


class TextrepRNNSeq2SeqForConditionalGeneration(PreTrainedModel, GenerationMixin):
    config_class = TextrepRNNSeq2SeqConfig

    def __init__(self, config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.encoder = TextrepEncoder(config)
        self.decoder = TextrepDecoder(config)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        if config.copy_attention:  # reads [context; RNN output; embedded input]
            self.pointer = TextrepPointerGenerator(2 * config.hidden_size + config.embedding_dim)
        self.post_init()

    def get_encoder(self):
        return TextrepRNNSeq2SeqEncoder(self)

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None, **kwargs):
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        states = encoder_outputs.last_hidden_state
        mask = (torch.ones(states.shape[:2], dtype=torch.bool, device=states.device) if attention_mask is None
                else attention_mask.bool())
        inputs = self.shared(decoder_input_ids)
        out = self.decoder(inputs, states, mask, encoder_outputs.final_state)
        logits = F.linear(out.attentional, self.shared.weight, self.output_bias)
        if self.config.copy_attention:
            features = torch.cat([out.context, out.hidden, inputs], dim=-1)
            logits = self.pointer(logits, features, out.attention, encoder_outputs.source_ids)
        return Seq2SeqLMOutput(logits=logits, encoder_last_hidden_state=states)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # generate must not build a cache this model would not fill

    def prepare_inputs_for_generation(self, decoder_input_ids, encoder_outputs=None, attention_mask=None, **kwargs):
        # no cache: the decoder reads the whole prefix at every step; the source's ids travel in encoder_outputs
        return {"decoder_input_ids": decoder_input_ids, "encoder_outputs": encoder_outputs,
                "attention_mask": attention_mask}
