"""The schemas of BERT's config blocks (pipeline/config.py), with their defaults: the blocks it owns (tokenizer,
examples, pretrain_phase2, pretrain_tapt) and the keys it adds to shared blocks (its masked-LM settings in `pretrain`,
the fine-tuning and report settings only BERT reads). No torch: the Ray workers of its data stages read the tokenizer
and examples blocks here and never load it (tests/run/test_layering.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from data_prep.corpus.tokenizer import SPECIAL_TOKENS
from data_prep.examples.bert_examples import NUM_SPECIAL_TOKENS_IN_PAIR, PACKINGS
from pipeline.engine.settings import FRACTION, POSITIVE_INT, Number, ranged
from pipeline.schema import PretrainConfig, override_block

# pretrain.objective: what the model trained by the stage is and how its loss is computed (pipeline/bert/module.py)
PRETRAINING_OBJECTIVES = ("mlm", "electra")
Objective = StrEnum("Objective", {name: name for name in PRETRAINING_OBJECTIVES}, module=__name__)
Packing = StrEnum("Packing", {name: name for name in PACKINGS}, module=__name__)
# pretrain.masking: what masked LM hides as one unit (pipeline/bert/data.py's BertPretrainingCollator). token: pieces
# chosen independently (Devlin et al. 2019); whole_word: a word's WordPiece pieces together (google-research/bert's
# whole-word masking; seed 003), so a masked piece cannot be read off the rest of its word; span: contiguous runs of
# whole words of geometric length (SpanBERT, Joshi et al. 2020), so a masked word cannot be read off its neighbours
MASKINGS = ("token", "whole_word", "span")
Masking = StrEnum("Masking", {name: name for name in MASKINGS}, module=__name__)
# The shortest sentence pair: [CLS] a [SEP] b [SEP], a token on each side (google-research/bert's
# create_instances_from_document needs two); a shorter examples.max_seq_length failed in the bert_examples stage.
MIN_PAIR_LENGTH = NUM_SPECIAL_TOKENS_IN_PAIR + 2
PAIR_LENGTH = Number(int, MIN_PAIR_LENGTH, why="[CLS] a [SEP] b [SEP] with a token on each side")


@dataclass
class TokenizerConfig:
    """The `tokenizer` block: BERT's WordPiece vocabulary."""
    # small corpus: 30522 would leave most pieces unseen
    vocab_size: int = ranged(8000, Number(int, len(SPECIAL_TOKENS) + 1, why=(
        f"{len(SPECIAL_TOKENS)} special tokens and at least one word piece; the bert_tokenizer stage refuses a "
        "vocabulary too small for the corpus's characters")))
    min_frequency: int = 2
    lowercase: bool = True
    # Trained on at most this many sentences, evenly spaced through the corpus (SentencePiece's input_sentence_size);
    # null: all. The trainer's memory grows with the distinct words it sees and its time with every sentence (68 MB of
    # books took it 50 s and 113 MB here), so 1 M sentences (~120 MB of books) bound both; BookCorpus has 74 M.
    max_sentences: Optional[int] = ranged(1_000_000, Number(int, 1, nullable=True))
    # Characters of the alphabet, the most frequent first; the others are [UNK]. null: every character of the corpus
    # (a Chinese corpus has thousands, which HF's default of 1,000 sent to [UNK]; a vocabulary too small for them is
    # refused with the size it needs). stage.json reports the alphabet and the [UNK] rate, warned about above 0.5 %.
    limit_alphabet: Optional[int] = None


@dataclass
class ExamplesConfig:
    """The `examples` block: BERT's pretraining instances."""
    max_seq_length: int = ranged(128, PAIR_LENGTH)
    # google-research/bert: 10 % shorter sequences to reduce pretrain/finetune mismatch
    short_seq_prob: float = ranged(0.1, FRACTION)
    # passes over the corpus with different pairings (masking is dynamic, in the collator)
    dupe_factor: int = ranged(1, POSITIVE_INT)
    # sentence_pairs: google-research/bert's [CLS] A [SEP] B [SEP], B the next sentences or a random document's, for
    # next-sentence prediction; doc_sentences: RoBERTa's contiguous sentences of one document, one segment (Liu et al.
    # 2019, §4.2), for masked LM alone (pretrain.next_sentence_prediction=false)
    packing: Packing = Packing.sentence_pairs


@dataclass
class ElectraConfig:
    generator_layers: int = 1  # Clark et al.: generators 1/4-1/2 the discriminator's size work best
    discriminator_weight: float = 50.0  # their lambda: the detection loss is per token and ~50x smaller than the MLM's


@dataclass
class BertPretrainConfig:
    """What BERT adds to `pretrain`."""
    mlm_probability: float = ranged(0.15, Number(float, 0, 1, low_open=True))
    max_predictions_per_seq: int = ranged(20, POSITIVE_INT)  # google-research/bert: round(0.15 * 128)
    masking: Masking = Masking.token  # the unit masked LM hides: token, whole_word or span (MASKINGS above)
    next_sentence_prediction: bool = True  # false: masked LM alone (RoBERTa; Cramming), NSP head scored, not trained
    # mlm: BERT's masked LM (+ NSP). electra: replaced-token detection (Clark et al. 2020): a generator of
    # electra.generator_layers layers fills the masked positions, the model's encoder learns from every token which
    # were replaced; needs next_sentence_prediction=false
    objective: Objective = Objective.mlm
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    # > 0: the two segments of each instance are encoded apart, and their mean-pooled states learn, beside masked LM,
    # to find each other among the batch's other segments (in-batch InfoNCE; DeCLUTR, Giorgi et al. 2021, whose
    # positives are spans of one document; Quick-Thoughts, Logeswaran & Lee 2018): what a review's sentences share
    # (its topic, its opinion) is pulled into the pooled vector a classifier reads. The loss's weight against MLM's;
    # needs next_sentence_prediction=false, as NSP reads the segments together
    contrastive_weight: float = ranged(0.0, Number(float, 0))
    # SimCSE's (Gao et al. 2021), on cosine similarities
    contrastive_temperature: float = ranged(0.05, Number(float, 0, low_open=True))
    # Continued pretraining (Gururangan et al. 2020's domain-adaptive pretraining; HF run_mlm's --model_name_or_path):
    # a HuggingFace BERT directory (config.json, model.safetensors or pytorch_model.bin, tokenizer files) whose
    # architecture, weights and tokenizer the bert_pretrain stage starts from, instead of `model` from scratch and a
    # trained tokenizer; its MLM (and NSP) head is loaded where the checkpoint has one, else freshly initialised.
    init_from: Optional[str] = None


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
    # at most model.config.max_position_embeddings, which phase 1 must have
    own=(("max_seq_length", int, ranged(512, PAIR_LENGTH)),))


# The `pretrain_tapt` block. Task-adaptive pretraining (TAPT; Gururangan et al. 2020, "Don't Stop Pretraining", §4),
# run when pipeline.stages has bert_pretrain_tapt: stage bert_examples_tapt packs the fine-tuning task's train texts,
# one text per instance (RoBERTa's doc_sentences, whose documents are here one review), and bert_pretrain_tapt
# continues bert_pretrain's final weights on them with masked LM alone, a fresh optimizer and schedule, the masks
# re-drawn for every batch (so each epoch over the texts is masked anew); finetune, evaluate and report then use its
# encoder. Only the texts fine-tuning may train on are read: with finetune.selection_fraction, the train pool without
# its held-out part, never a dev or test text (pipeline/downstream/task_data.py train_pool_documents). Every
# `pretrain` key is also a key here, null where TAPT keeps pretrain's value. Off unless asked for: measured on the
# selection split (seeds 1-3, bert_tiny), 300 steps moved bert by +1.0 / -0.15 / +0.1 points at 300 / 1,000 / all
# labels and 1,000 steps by +0.2 / +0.5 / -0.2, within the seeds' spread, never ahead at both 300 and 1,000
# (docs/pretraining_recipes.md, "The control row").
TAPT_DEFAULTS = {
    # Rotten Tomatoes' 10,282-sentence train pool is ~315 batches of 32: 300 steps are about one epoch (Gururangan et
    # al. train 100 epochs of a small task; here the number is set by measurement)
    "max_steps": 300,
    "warmup_steps": 30,
    "next_sentence_prediction": False,  # one text per instance: no second segment
    "encoder_snapshots": field(default_factory=list),  # TAPT's own steps
}
PretrainTaptConfig = override_block(
    "PretrainTaptConfig", __name__, (PretrainConfig, BertPretrainConfig), TAPT_DEFAULTS,
    # a longer text is cut at its end; at most model.config.max_position_embeddings for learned positions
    own=(("max_seq_length", int, ranged(128, Number(int, 3, why="[CLS] a token [SEP]"))),))


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
          "pretrain_phase2": PretrainPhase2Config,
          "pretrain_tapt": PretrainTaptConfig, "finetune": BertFinetuneConfig, "report": AttentionReportConfig}
