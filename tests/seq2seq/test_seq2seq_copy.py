"""Seed 000's first experiment: the synthetic copy task (random symbols in, the same symbols out), learned by the tiny
Transformer encoder-decoder and the tiny RNN encoder-decoder with attention, to >= 99 % token accuracy on fresh
sequences decoded greedily, within a test-sized budget. The Transformer trains as seed 000's does (Adam with betas
(0.9, 0.98), eps 1e-9 under the Noam schedule), and is decoded with seed 000's greedy_decode.

The number of steps each took (the first evaluation at >= 99 %) is printed:
`pytest -s tests/seq2seq/test_seq2seq_copy.py`."""
from __future__ import annotations

import pytest
import torch

from models.generation import greedy
from models.rnn_seq2seq import RNNEncoderDecoder, rnn_seq2seq_config
from models.seq2seq import EncoderDecoder, greedy_decode, seq2seq_config, shift_right
from pipeline.engine.optim import noam_schedule

PAD, START, EOS = 0, 1, 2
V = 13  # padding, start, end and 10 symbols (seed 000: 10 symbols and the start symbol)
LENGTH = 10  # symbols per sequence, as seed 000
BATCH = 64
EVAL_EVERY = 25


def copy_batch(generator: torch.Generator, batch_size: int):
    """(source (B, L), decoder inputs (B, L + 1), targets (B, L + 1)): the target is the source and the end token."""
    source = torch.randint(EOS + 1, V, (batch_size, LENGTH), generator=generator)
    targets = torch.cat([source, torch.full((batch_size, 1), EOS)], dim=1)
    return source, shift_right(targets, START, PAD), targets


def token_accuracy(model, n: int = 100) -> float:
    """The fraction of the L symbols and the end token decoded right, greedily, on n fresh sequences."""
    source, _, targets = copy_batch(torch.Generator().manual_seed(12345), n)
    if isinstance(model, EncoderDecoder):
        out = greedy_decode(model.eval(), source, None, LENGTH + 2, START)[:, 1:]
        model.train()
    else:
        rows = greedy(model, source.tolist(), LENGTH + 1)
        out = torch.tensor([row + [PAD] * (LENGTH + 1 - len(row)) for row in rows])
    return (out == targets).float().mean().item()


def steps_to_learn(model, optimizer, max_steps: int, scheduler=None, seed: int = 0) -> tuple[int | None, float]:
    """Train on fresh batches until the token accuracy (checked every EVAL_EVERY steps) reaches 99 %: (the steps it
    took, or None within max_steps; the last accuracy)."""
    generator = torch.Generator().manual_seed(seed)
    model.train()
    accuracy = 0.0
    for step in range(1, max_steps + 1):
        source, decoder_inputs, targets = copy_batch(generator, BATCH)
        loss = model(source, decoder_inputs, targets=targets).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if step % EVAL_EVERY == 0:
            accuracy = token_accuracy(model)
            if accuracy >= 0.99:
                return step, accuracy
    return None, accuracy


def test_the_tiny_transformer_learns_to_copy():
    torch.manual_seed(0)
    config = seq2seq_config("seq2seq_tiny", vocab_size=V, max_positions=16, dropout=0.0, label_smoothing=0.0,
                            pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS)
    model = EncoderDecoder(config)
    assert token_accuracy(model) < 0.2  # chance is 1/13 per token
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    noam = noam_schedule(optimizer, config.d_model, warmup=100, factor=0.5)
    steps, accuracy = steps_to_learn(model, optimizer, max_steps=400, scheduler=noam)
    print(f"\ncopy task: seq2seq_tiny reached {accuracy:.1%} token accuracy after {steps} steps of {BATCH}")
    assert steps is not None, f"seq2seq_tiny reached only {accuracy:.1%} token accuracy in 400 steps"


@pytest.mark.parametrize("cell,attention", [("lstm", "additive"), ("gru", "dot"), ("gru", "general")])
def test_the_tiny_rnn_with_attention_learns_to_copy(cell, attention):
    torch.manual_seed(0)
    config = rnn_seq2seq_config("rnn_attn_tiny", vocab_size=V, cell=cell, attention=attention, dropout=0.0,
                                pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS)
    model = RNNEncoderDecoder(config)
    assert token_accuracy(model) < 0.2
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps, accuracy = steps_to_learn(model, optimizer, max_steps=400)
    print(f"\ncopy task: rnn_attn_tiny ({cell}, {attention}) reached {accuracy:.1%} token accuracy after {steps} "
          f"steps of {BATCH}")
    assert steps is not None, f"rnn_attn_tiny ({cell}, {attention}) reached only {accuracy:.1%} in 400 steps"
