"""The encoder-decoders the seq2seq family trains, as its stages see them: models/seq2seq.py's Transformer (seed 000,
`model=seq2seq_*`) and models/rnn_seq2seq.py's RNN with attention (seed 001, `model=rnn_attn_*`), whichever the run's
`model` block builds. The stages use what both models have: the same batches (forward(input_ids, decoder_input_ids,
attention_mask, targets) -> loss), models/generation.py's decoding (start_decoding), the encoder's states
(encoder_states), a line describing the model (describe) and the config's ids and max_positions. What differs is the
checkpoint's format tag, so writing and reading one goes through here."""
from __future__ import annotations

from pathlib import Path

from torch import nn

from models import rnn_seq2seq, seq2seq
from models.checkpoint import read_config

# (model class, checkpoint format, save, load), one per architecture
ARCHITECTURES = ((seq2seq.EncoderDecoder, seq2seq.CHECKPOINT_FORMAT, seq2seq.save_pretrained, seq2seq.load_pretrained),
                 (rnn_seq2seq.RNNEncoderDecoder, rnn_seq2seq.CHECKPOINT_FORMAT, rnn_seq2seq.save_pretrained,
                  rnn_seq2seq.load_pretrained))


def save_model(model: nn.Module, path: Path) -> None:
    for model_class, _, save, _ in ARCHITECTURES:
        if isinstance(model, model_class):
            return save(model, path)
    raise TypeError(f"{type(model).__name__} is not an encoder-decoder the seq2seq family writes; its `model` must "
                    f"build one of {', '.join(a[0].__name__ for a in ARCHITECTURES)}")


def load_model(path: Path) -> nn.Module:
    """The encoder-decoder a seq2seq_pretrain stage wrote into `path`, of whichever architecture it was."""
    found = read_config(path).get("format")
    for _, checkpoint_format, _, load in ARCHITECTURES:
        if found == checkpoint_format:
            return load(path)
    raise ValueError(f"{path}/config.json is a {found!r} checkpoint, not an encoder-decoder of the seq2seq family "
                     f"({', '.join(a[1] for a in ARCHITECTURES)})")
