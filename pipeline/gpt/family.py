"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from models.hf.gpt import describe
from pipeline.engine.family import Family, Generation, Tiny
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.settings import GptReportConfig
from pipeline.gpt.stages import GPT_STAGES, GptConfig, validate

FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section, validate=validate,
                config={"gpt": GptConfig, "report": GptReportConfig}, describe_export=describe,
                generation=Generation(samples.STAGE, "gpt_tiny", samples.continue_texts, continues=True),
                tiny=Tiny("gpt_tiny", ("prepare", "gpt_tokenizer", "gpt_blocks"), (
                    "gpt.vocab_size=300", "gpt.min_frequency=1", "gpt.block_size=16", "+model.config.n_embd=32")),
                numbers={"gpt.vocab_size": Number(int, MIN_VOCAB_SIZE, why=(
                    "byte-level BPE's 256 byte pieces and <|endoftext|>, which it keeps whatever the setting")),
                         "gpt.block_size": POSITIVE_INT, "gpt.max_sentences": Number(int, 1, nullable=True)})
