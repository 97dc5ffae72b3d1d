"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from dataclasses import dataclass

from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.stages import GPT_STAGES


@dataclass
class GptConfig:
    """The `gpt` block (experiment=gpt_*): byte-level BPE and packed blocks (data_prep/gpt_blocks.py)."""
    vocab_size: int = 8000  # GPT-2: 50257
    min_frequency: int = 2
    block_size: int = 128  # tokens a block feeds the model; also the model's context (n_positions). GPT-2: 1024


FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section,
                config={"gpt": GptConfig}, numbers={"gpt.vocab_size": POSITIVE_INT, "gpt.block_size": POSITIVE_INT})
