"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.stages import GPT_STAGES, validate

FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section, validate=validate,
                numbers={"gpt.vocab_size": POSITIVE_INT, "gpt.block_size": POSITIVE_INT,
                         "gpt.max_sentences": Number(int, 1, nullable=True)})
