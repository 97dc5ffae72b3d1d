"""The `seq2seq` block, typed, in a module without torch: its data stages read it in Ray workers that never load torch
(tests/run/test_layering.py)."""
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from data_prep.examples.seq2seq_examples import OBJECTIVES

Objective = StrEnum("Objective", {name: name for name in OBJECTIVES}, module=__name__)


@dataclass
class Seq2SeqBlockConfig:
    """The `seq2seq` block (experiment=seq2seq_*): the tokenizer and the pretraining pairs
    (data_prep/examples/seq2seq_examples.py)."""
    vocab_size: int = 8000  # special tokens included; BART: 50265, T5: 32000
    max_sentences: Optional[int] = 1_000_000  # the BPE is trained on at most this many sentences, as GPT's
    min_frequency: int = 2
    # T5's sentinels, <extra_id_0>...: span corruption's spans per pair are one fewer (T5: 100)
    num_sentinels: int = 100
    block_size: int = 128  # tokens of a target, its end token included: whole sentences of one book
    objective: Objective = Objective.bart  # bart: sentence permutation + text infilling; span_corruption: T5's
