"""The encoder-decoder (seed 000's Transformer; BART, Lewis et al. 2020; T5, Raffel et al. 2020): byte-level BPE with
mask and sentinel tokens, denoising pretraining on source/target pairs built from the books, its encoder for
`evaluate`, and fine-tuning on generation tasks (beam search, ROUGE and BLEU)."""
from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.seq2seq.downstream import FINETUNE_KINDS
from pipeline.seq2seq.encoder import ENCODERS
from pipeline.seq2seq.pretrain import SEQ2SEQ_STAGES
from pipeline.seq2seq.settings import Seq2SeqBlockConfig

FAMILY = Family("seq2seq", stages=SEQ2SEQ_STAGES, pretraining_stages=("seq2seq_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, config={"seq2seq": Seq2SeqBlockConfig},
                numbers={"seq2seq.vocab_size": Number(int, MIN_VOCAB_SIZE, why=(
                    "byte-level BPE's 256 byte pieces, which it keeps whatever the setting")),
                         "seq2seq.block_size": Number(int, 3), "seq2seq.num_sentinels": Number(int, 2),
                         "seq2seq.min_frequency": POSITIVE_INT, "seq2seq.max_sentences": Number(int, 1, nullable=True)})
