"""ELECTRA's replaced-token detection (Clark et al. 2020) for pretraining a BERT encoder.

A small generator does masked-LM at the masked positions; its samples replace those tokens, and the discriminator (the
BERT encoder that downstream stages read) predicts for every token whether it was replaced. Every token gives the
discriminator a training signal, where masked LM learns from the ~15 % that are masked: Clark et al. reach MLM-level
GLUE scores with about a quarter of the compute, and their gap is widest for small models and short runs, the
regime of a CPU (§3.3, Fig. 4).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from models import IGNORE_INDEX
from models.bert import (
    BertConfig,
    BertEncoder,
    BertLMPredictionHead,
    BertModel,
    BertPretrainingModel,
)


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of probs (N, V), drawn in proportion to its entries, by inverting the cumulative sum with
    one uniform draw per row: torch.multinomial draws an exponential per entry, ~45 % of an ELECTRA step on a CPU at
    a vocabulary of 8,000."""
    cdf = probs.cumsum(dim=-1)  # (N, V)
    u = torch.rand(probs.size(0), 1, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.size(-1) - 1)


class ElectraDiscriminatorPredictions(nn.Module):
    """One logit per token: was it replaced by the generator? (HF's name; dense, GELU, dense to 1.)"""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states):
        return self.dense_prediction(F.gelu(self.dense(hidden_states))).squeeze(-1)  # (B, T)


class ElectraForPreTraining(BertPretrainingModel):
    """Generator and discriminator over one shared embedding layer (Clark et al. §3.2: sharing the token embeddings
    helps, since the generator's softmax updates every embedding densely).

    The generator is the discriminator's architecture with `generator_layers` layers: Clark et al. find generators of
    1/4-1/2 the discriminator's size best (a stronger one makes the task too hard, Fig. 3); they shrink the width, we
    shrink the depth so that the embeddings are shared without a projection."""
    TIED_DECODER = "generator_predictions.decoder.weight"

    def __init__(self, config: BertConfig, generator_layers: int = 1):
        super().__init__(config)
        if not 1 <= generator_layers <= config.num_hidden_layers:
            raise ValueError(f"generator_layers={generator_layers} must be between 1 and the discriminator's "
                             f"num_hidden_layers={config.num_hidden_layers} (Clark et al.: 1/4-1/2 of its size)")
        self.bert = BertModel(config)  # the discriminator
        # No next-sentence task trains the pooler: frozen, so that distributed data parallel waits for no gradient
        # of it; fine-tuning builds its own trainable copy.
        self.bert.pooler.requires_grad_(False)
        self.generator = BertEncoder(replace(config, num_hidden_layers=generator_layers))
        self.generator_predictions = BertLMPredictionHead(config, self.bert.embeddings.word_embeddings)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        for module in (self.generator, self.generator_predictions, self.discriminator_predictions):
            module.apply(self._init_weights)

    def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions, mlm_labels):
        """input_ids (B, T) with the masked-LM corruption applied; mlm_positions/mlm_labels (B, P): the corrupted
        positions and their original ids, IGNORE_INDEX where a row has fewer than P.

        Returns (mlm_logits (B, P, V) of the generator, rtd_logits (B, T) of the discriminator, replaced (B, T):
        whether the discriminator's input token differs from the original). The generator's samples are drawn from
        the global RNG, like dropout's masks; no gradient flows through them (Clark et al. §2)."""
        predicted = mlm_labels != IGNORE_INDEX  # (B, P)
        rows, slots = predicted.nonzero(as_tuple=True)
        columns = mlm_positions[rows, slots]
        original = input_ids.clone()
        original[rows, columns] = mlm_labels[rows, slots]

        hidden = self.generator(self.bert.embeddings(input_ids, token_type_ids), attention_mask)[0]
        index = mlm_positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1))
        mlm_logits = self.generator_predictions(hidden.gather(1, index))  # (B, P, V)

        with torch.no_grad():
            sampled = sample_rows(F.softmax(mlm_logits[rows, slots].float(), dim=-1))
        corrupted = original.clone()
        corrupted[rows, columns] = sampled
        sequence_output, _ = self.bert(corrupted, token_type_ids, attention_mask)
        # a sample equal to the original counts as original (Clark et al. §2: "if the generator happens to generate
        # the correct token, that token is considered real")
        return mlm_logits, self.discriminator_predictions(sequence_output), corrupted != original
