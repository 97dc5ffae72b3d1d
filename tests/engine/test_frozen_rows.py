"""pretrain.freeze_embeddings / finetune.freeze_embeddings (all | with_vector | none): with_vector keeps the rows of
the token embeddings that started from a vector bit for bit, through AdamW's steps, weight decay, clipping and a tied
output layer, and trains the others (pipeline.engine.pretraining.keep_word_embeddings, pipeline.engine.optim's
freeze_rows)."""
import numpy as np
import pytest
import torch
from torch import nn

from pipeline.engine.optim import adamw_with_schedule, lamb_with_schedule
from pipeline.engine.pretraining import keep_word_embeddings


class TiedLM(nn.Module):
    """Token embeddings read at the input and, tied, as the output layer (BERT's and GPT's decoders)."""

    def __init__(self, vocab: int = 12, width: int = 8):
        super().__init__()
        self.embeddings = nn.Embedding(vocab, width)
        self.layer = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layer(self.embeddings(ids))) @ self.embeddings.weight.T


def train(model: nn.Module, steps: int = 5, make_optimizer=adamw_with_schedule) -> None:
    optimizer = make_optimizer(model, 1e-2, 0.01, (0.9, 0.999), 1, steps)["optimizer"]
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 12, (4, 6), generator=generator)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(1, dims=1).flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


HAS_VECTOR = np.array([True, False, True, True, False, True, True, True, False, True, True, True])


@pytest.mark.parametrize("make_optimizer", [adamw_with_schedule, lamb_with_schedule])
def test_with_vector_keeps_the_rows_that_have_one_bit_for_bit_and_trains_the_others(make_optimizer):
    torch.manual_seed(0)
    model = TiedLM()
    start = model.embeddings.weight.detach().clone()
    assert keep_word_embeddings(model.embeddings, "with_vector", HAS_VECTOR) == HAS_VECTOR.sum()
    train(model, make_optimizer=make_optimizer)
    after = model.embeddings.weight.detach()
    kept, trained = torch.from_numpy(HAS_VECTOR), torch.from_numpy(~HAS_VECTOR)
    assert torch.equal(after[kept], start[kept])  # weight decay (0.01) would have moved them
    assert (after[trained] - start[trained]).abs().amax(dim=1).min() > 1e-4  # every row without a vector moved
    assert not torch.equal(model.layer.weight, TiedLM().layer.weight)


def test_all_keeps_every_row_and_none_trains_every_row():
    torch.manual_seed(0)
    frozen, free = TiedLM(), TiedLM()
    start = frozen.embeddings.weight.detach().clone()
    keep_word_embeddings(frozen.embeddings, "all", HAS_VECTOR)
    assert keep_word_embeddings(free.embeddings, "none", HAS_VECTOR) == 0
    free_start = free.embeddings.weight.detach().clone()
    train(frozen)
    train(free)
    assert torch.equal(frozen.embeddings.weight, start)
    assert (free.embeddings.weight.detach() - free_start).abs().amax(dim=1).min() > 1e-4


def test_with_vector_without_vectors_keeps_nothing_and_rows_past_the_table_train():
    torch.manual_seed(0)
    model = TiedLM()
    assert keep_word_embeddings(model.embeddings, "with_vector", None) == 0
    shorter = TiedLM()  # a generation task's new tokens: rows past the piece-vector table
    assert keep_word_embeddings(shorter.embeddings, "with_vector", HAS_VECTOR[:10]) == HAS_VECTOR[:10].sum()
    start = shorter.embeddings.weight.detach().clone()
    train(shorter)
    assert not torch.equal(shorter.embeddings.weight[10:], start[10:])
