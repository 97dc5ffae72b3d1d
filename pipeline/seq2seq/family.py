"""The encoder-decoder (seed 000's Transformer; BART, Lewis et al. 2020; T5, Raffel et al. 2020): byte-level BPE with
mask and sentinel tokens, denoising pretraining on source/target pairs built from the books, its encoder for
`evaluate`, and fine-tuning on generation tasks (beam search, ROUGE and BLEU)."""
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from data_prep.examples.seq2seq_examples import OBJECTIVES
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.seq2seq.downstream import FINETUNE_KINDS
from pipeline.seq2seq.encoder import ENCODERS
from pipeline.seq2seq.stages import SEQ2SEQ_STAGES

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


FAMILY = Family("seq2seq", stages=SEQ2SEQ_STAGES, pretraining_stages=("seq2seq_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, config={"seq2seq": Seq2SeqBlockConfig},
                numbers={"seq2seq.vocab_size": Number(int, MIN_VOCAB_SIZE, why=(
                    "byte-level BPE's 256 byte pieces, which it keeps whatever the setting")),
                         "seq2seq.block_size": Number(int, 3), "seq2seq.num_sentinels": Number(int, 2),
                         "seq2seq.min_frequency": POSITIVE_INT, "seq2seq.max_sentences": Number(int, 1, nullable=True)})
