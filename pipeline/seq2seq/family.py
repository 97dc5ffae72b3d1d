"""The encoder-decoder (seed 001's RNN with attention, seq2seq_tiny's; seed 000's Transformer; BART, Lewis et al. 2020;
T5, Raffel et al. 2020): byte-level BPE with mask and sentinel tokens, denoising pretraining on source/target pairs
built from the books, its encoder for `evaluate`, fine-tuning on generation tasks (beam search, ROUGE and BLEU), its
model as transformers' AutoModelForSeq2SeqLM loads it for `python -m pipeline.export`, and its outputs for `python
-m pipeline.generate`."""
from models.hf.seq2seq import describe
from pipeline.engine.family import Family, Generation, Tiny
from pipeline.seq2seq.downstream import FINETUNE_KINDS
from pipeline.seq2seq.encoder import ENCODERS
from pipeline.seq2seq.outputs import write_outputs
from pipeline.seq2seq.pretrain import SEQ2SEQ_STAGES
from pipeline.seq2seq.settings import Seq2SeqBlockConfig, Seq2SeqFinetuneConfig

FAMILY = Family("seq2seq", stages=SEQ2SEQ_STAGES, pretraining_stages=("seq2seq_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS,
                config={"seq2seq": Seq2SeqBlockConfig, "finetune": Seq2SeqFinetuneConfig},
                describe_export=describe,
                generation=Generation("seq2seq_pretrain", "seq2seq_tiny", write_outputs),
                # without the experiment's GPT baseline (tests/gpt/test_gpt_generation.py fine-tunes GPT on headlines)
                tiny=Tiny("seq2seq_tiny", ("prepare", "seq2seq_tokenizer", "seq2seq_examples"), (
                    "seq2seq.vocab_size=320", "seq2seq.min_frequency=1", "seq2seq.block_size=32",
                    "seq2seq.num_sentinels=8", "+model.config.embedding_dim=16", "+model.config.hidden_size=32",
                    "finetune.models=[seq2seq]")))
