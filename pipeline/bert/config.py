"""The schemas of BERT's config blocks (pipeline/config.py), with their defaults: the blocks it owns (tokenizer,
examples, pretrain_phase2) and the keys it adds to shared blocks (its masked-LM settings in `pretrain`, the fine-tuning
and report settings only BERT reads)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from pipeline.bert.settings import BertPretrainConfig, ExamplesConfig, TokenizerConfig
from pipeline.schema import PretrainConfig, override_block

BERT_POOLINGS = ("cls", "mean")  # the sentence vector: pooled [CLS] state, or mean of the final states
# and for fine-tuning, "prompt": the masked-LM head's scores of the task's label words in its template
Pooling = StrEnum("Pooling", {name: name for name in (*BERT_POOLINGS, "prompt")}, module=__name__)


@dataclass
class BertPretrainSettings(BertPretrainConfig, PretrainConfig):
    """A phase's settings as its stage reads them (pipeline/bert/pretrain.py Phase.settings): the harness's keys and
    BERT's objective."""


# The `pretrain_phase2` block. BERT's phase 2 (Devlin et al. 2019, §A.2), run when pipeline.stages has
# bert_pretrain_phase2 (bert_base does): stage bert_examples_phase2 builds instances at max_seq_length, then
# bert_pretrain_phase2 continues bert_pretrain's final weights (encoder and MLM/NSP heads) with a fresh optimizer and
# schedule, so the positions past phase 1's length get trained; finetune, evaluate and report then use its encoder.
# Every `pretrain` key is also a key here, null where phase 2 keeps pretrain's value (pipeline/bert/pretrain.py
# Phase.settings): pretrain_phase2.accumulate_grad_batches=4.
PHASE_2_DEFAULTS = {
    "max_steps": 100,  # google-research/bert: the last 10 % of the steps
    "batch_size": 8,  # pretrain's tokens per batch (32 x 128) at length 512
    "lr": "${pretrain.lr}",
    "warmup_steps": 10,
    "max_predictions_per_seq": 80,  # google-research/bert at length 512 (round(0.15 * 512) = 77, rounded up)
    "encoder_snapshots": field(default_factory=list),  # phase 2's own steps, not phase 1's
}
PretrainPhase2Config = override_block(
    "PretrainPhase2Config", __name__, (PretrainConfig, BertPretrainConfig), PHASE_2_DEFAULTS,
    own=(("max_seq_length", int, 512),))  # at most model.config.max_position_embeddings, which phase 1 must have


@dataclass
class BertFinetuneConfig:
    """What BERT's fine-tuning adds to `finetune`."""
    # What a sentence (pair) classifier reads: cls = BERT's pooled [CLS] state; mean = the mean of the final token
    # states (Sentence-BERT's pooling), which masked-LM pretraining trains directly, while [CLS] and the pooler are
    # trained only by NSP, which stays at its majority rate in make run's budget. With dropout 0.1, mean lifted both
    # rows with 1,000 labels on the selection split (docs/pretraining_recipes.md); prompt = no new head: the masked-LM
    # head's scores of the task's label words at the [MASK] of its template (PET, LM-BFF; the task YAML's
    # prompt_template and prompt_label_words), for single-sentence classification
    pooling: Pooling = Pooling.mean
    # The fine-tuned BERT's dropout; null keeps the encoder's. The BERT pretraining recipe has none (Cramming: every
    # token is seen about once), but a few thousand labelled sentences are seen for epochs: BERT fine-tunes at 0.1
    # (Devlin et al. 2019). GPT keeps its model's GPT-2 dropout (0.1) and ELMo the paper's 0.5 on its frozen features.
    dropout: Optional[float] = 0.1
    # for bert_external: config.json, model.safetensors/pytorch_model.bin and tokenizer files
    external_encoder: Optional[str] = None


@dataclass
class AttentionReportConfig:
    """The report's attention heat-map (pipeline/bert/attention.py); it needs `bert_pretrain` in the run."""
    # null: no attention heat-map
    attention_sentence: Optional[str] = "The animal didn't cross the street because it was too tired"
    attention_layer: int = -1  # 0-based; negative counts from the last layer
    attention_head: int = 0


CONFIG = {"tokenizer": TokenizerConfig, "examples": ExamplesConfig, "pretrain": BertPretrainConfig,
          "pretrain_phase2": PretrainPhase2Config, "finetune": BertFinetuneConfig, "report": AttentionReportConfig}
