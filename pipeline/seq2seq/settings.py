"""The `seq2seq` block, typed, in a module without torch: its data stages read it in Ray workers that never load torch
(tests/run/test_layering.py)."""
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from data_prep.examples.seq2seq_examples import OBJECTIVES
from pipeline.engine.settings import POSITIVE_INT, Number, ranged

Objective = StrEnum("Objective", {name: name for name in OBJECTIVES}, module=__name__)


@dataclass
class Seq2SeqBlockConfig:
    """The `seq2seq` block (experiment=seq2seq_*): the tokenizer and the pretraining pairs
    (data_prep/examples/seq2seq_examples.py)."""
    vocab_size: int = ranged(8000, Number(int, MIN_VOCAB_SIZE, why=(  # special tokens included; BART: 50265, T5: 32000
        "byte-level BPE's 256 byte pieces, which it keeps whatever the setting")))
    # the BPE is trained on at most this many sentences, as GPT's
    max_sentences: Optional[int] = ranged(1_000_000, Number(int, 1, nullable=True))
    min_frequency: int = ranged(2, POSITIVE_INT)
    # T5's sentinels, <extra_id_0>...: span corruption's spans per pair are one fewer (T5: 100)
    num_sentinels: int = ranged(100, Number(int, 2))
    # tokens of a target, its end token included: whole sentences of one book
    block_size: int = ranged(128, Number(int, 3))
    # bart: sentence permutation + text infilling; span_corruption: T5's; gap_sentences: PEGASUS's whole sentences
    objective: Objective = Objective.bart


@dataclass
class Seq2SeqFinetuneConfig:
    """What the encoder-decoder's fine-tuning adds to `finetune` (a key of that block: changing it reruns fine-tuning
    alone, not the pretraining)."""
    # The fine-tuned model's `dropout` (the RNN's on its embeddings, between layers and on h~; the Transformer's on its
    # sublayer outputs and embeddings), for the pretrained model and its twin and control alike; null keeps the
    # pretrained model's. 1,671 headline pairs are seen for 10 epochs where pretraining saw each block about once
    # (docs/seq2seq.md, "Repetition blocking, label smoothing, fine-tuning epochs and pretraining steps")
    seq2seq_dropout: Optional[float] = ranged(None, Number(float, 0, 1, high_open=True, nullable=True,
                                                           why="a dropout rate"))
