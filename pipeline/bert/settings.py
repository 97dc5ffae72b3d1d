"""BERT's blocks that its data stages read (tokenizer, examples) and what it adds to `pretrain`, typed, in a module
without torch, which the Ray workers of those stages never load (tests/run/test_layering.py). The rest of BERT's
schemas, with the torch-side names they take, are in pipeline/bert/config.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from data_prep.examples.bert_examples import PACKINGS

# pretrain.objective: what the model trained by the stage is and how its loss is computed (pipeline/bert/module.py)
PRETRAINING_OBJECTIVES = ("mlm", "electra")
Objective = StrEnum("Objective", {name: name for name in PRETRAINING_OBJECTIVES}, module=__name__)
Packing = StrEnum("Packing", {name: name for name in PACKINGS}, module=__name__)


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
    generator_layers: int = 1  # Clark et al.: generators 1/4-1/2 the discriminator's size work best
    discriminator_weight: float = 50.0  # their lambda: the detection loss is per token and ~50x smaller than the MLM's


@dataclass
class BertPretrainConfig:
    """What BERT adds to `pretrain`."""
    mlm_probability: float = 0.15
    max_predictions_per_seq: int = 20  # google-research/bert: round(0.15 * 128)
    # mask a word's WordPiece pieces together (google-research/bert's whole-word masking; seed 003), so a masked piece
    # cannot be read off the rest of its word
    whole_word_masking: bool = False
    next_sentence_prediction: bool = True  # false: masked LM alone (RoBERTa; Cramming), NSP head scored, not trained
    # mlm: BERT's masked LM (+ NSP). electra: replaced-token detection (Clark et al. 2020): a generator of
    # electra.generator_layers layers fills the masked positions, the model's encoder learns from every token which
    # were replaced; needs next_sentence_prediction=false
    objective: Objective = Objective.mlm
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    # Continued pretraining (Gururangan et al. 2020's domain-adaptive pretraining; HF run_mlm's --model_name_or_path):
    # a HuggingFace BERT directory (config.json, model.safetensors or pytorch_model.bin, tokenizer files) whose
    # architecture, weights and tokenizer the bert_pretrain stage starts from, instead of `model` from scratch and a
    # trained tokenizer; its MLM (and NSP) head is loaded where the checkpoint has one, else freshly initialised.
    init_from: Optional[str] = None
