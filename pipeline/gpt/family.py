"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.settings import GptFinetuneConfig, GptReportConfig
from pipeline.gpt.stages import GPT_STAGES, GptConfig, validate

FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section, validate=validate,
                config={"gpt": GptConfig, "finetune": GptFinetuneConfig, "report": GptReportConfig},
                numbers={"gpt.vocab_size": Number(int, MIN_VOCAB_SIZE, why=(
                    "byte-level BPE's 256 byte pieces and <|endoftext|>, which it keeps whatever the setting")),
                         "gpt.block_size": POSITIVE_INT, "gpt.max_sentences": Number(int, 1, nullable=True),
                         "finetune.lm_loss_weight": Number(float, 0)})
