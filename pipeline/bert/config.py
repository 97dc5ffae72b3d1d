"""The schemas of BERT's config blocks (pipeline/config.py). The blocks it owns (tokenizer, examples, pretrain_phase2)
with their defaults; the keys it adds to shared blocks (its masked-LM settings in `pretrain`, the fine-tuning and report
settings only BERT reads) typed, their values in conf/config.yaml beside the block's others."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from omegaconf import MISSING

from data_prep.examples.bert_examples import PACKINGS
from pipeline.bert.encoder import BERT_POOLINGS
from pipeline.bert.module import PRETRAINING_OBJECTIVES
from pipeline.schema import PretrainConfig, override_block

Objective = StrEnum("Objective", {name: name for name in PRETRAINING_OBJECTIVES}, module=__name__)
Pooling = StrEnum("Pooling", {name: name for name in BERT_POOLINGS}, module=__name__)
Packing = StrEnum("Packing", {name: name for name in PACKINGS}, module=__name__)
# pretrain.init_embeddings: where the word embeddings start, random (the model's initialiser) or word2vec (the
# bert_piece_vectors stage)
InitEmbeddings = StrEnum("InitEmbeddings", {name: name for name in ("random", "word2vec")}, module=__name__)


@dataclass
class TokenizerConfig:
    """The `tokenizer` block: BERT's WordPiece vocabulary."""
    vocab_size: int = 8000  # small corpus: 30522 would leave most pieces unseen
    min_frequency: int = 2
    lowercase: bool = True
    # Trained on at most this many sentences, evenly spaced through the corpus (SentencePiece's input_sentence_size);
    # null: all. The trainer's memory grows with the distinct words it sees and its time with every sentence (68 MB of
    # books took it 50 s and 113 MB here), so 1 M sentences (~120 MB of books) bound both; BookCorpus has 74 M.
    max_sentences: Optional[int] = 1_000_000
    # Characters of the alphabet, the most frequent first; the others are [UNK]. null: every character of the corpus
    # (a Chinese corpus has thousands, which HF's default of 1,000 sent to [UNK]; a vocabulary too small for them is
    # refused with the size it needs). stage.json reports the alphabet and the [UNK] rate, warned about above 0.5 %.
    limit_alphabet: Optional[int] = None


@dataclass
class ExamplesConfig:
    """The `examples` block: BERT's pretraining instances."""
    max_seq_length: int = 128
    short_seq_prob: float = 0.1  # google-research/bert: 10 % shorter sequences to reduce pretrain/finetune mismatch
    dupe_factor: int = 1  # passes over the corpus with different pairings (masking is dynamic, in the collator)
    # sentence_pairs: google-research/bert's [CLS] A [SEP] B [SEP], B the next sentences or a random document's, for
    # next-sentence prediction; doc_sentences: RoBERTa's contiguous sentences of one document, one segment (Liu et al.
    # 2019, §4.2), for masked LM alone (pretrain.next_sentence_prediction=false)
    packing: Packing = Packing.sentence_pairs


@dataclass
class ElectraConfig:
    generator_layers: int = MISSING
    discriminator_weight: float = MISSING


@dataclass
class BertPretrainConfig:
    """What BERT adds to `pretrain`."""
    mlm_probability: float = MISSING
    max_predictions_per_seq: int = MISSING
    whole_word_masking: bool = MISSING
    next_sentence_prediction: bool = MISSING
    objective: Objective = MISSING
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    init_from: Optional[str] = MISSING
    init_embeddings: InitEmbeddings = MISSING
    freeze_embeddings: bool = MISSING


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
    pooling: Pooling = MISSING
    dropout: Optional[float] = MISSING
    external_encoder: Optional[str] = MISSING


@dataclass
class AttentionReportConfig:
    """The report's attention heat-map (pipeline/bert/attention.py)."""
    attention_sentence: Optional[str] = MISSING
    attention_layer: int = MISSING
    attention_head: int = MISSING


CONFIG = {"tokenizer": TokenizerConfig, "examples": ExamplesConfig, "pretrain": BertPretrainConfig,
          "pretrain_phase2": PretrainPhase2Config, "finetune": BertFinetuneConfig, "report": AttentionReportConfig}
