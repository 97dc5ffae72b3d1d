"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from dataclasses import dataclass, field
from typing import Optional

from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.stages import GPT_STAGES, validate
from pipeline.schema import NULL_MEANS, ModelConfig, PretrainConfig, override_block

# GPT's own pretraining settings, gpt.pretrain: pretrain's keys, null where GPT keeps pretrain's value. What a run that
# pretrains BERT too gives GPT alone (experiment=bert_vs_gpt: gpt.pretrain.lr=1e-3).
GptPretrainConfig = override_block("GptPretrainConfig", __name__, (PretrainConfig,))


@dataclass
class GptConfig:
    """The `gpt` block (experiment=gpt_*): byte-level BPE and packed blocks (data_prep/examples/gpt_blocks.py)."""
    vocab_size: int = 8000  # GPT-2: 50257
    max_sentences: Optional[int] = 1_000_000  # the BPE is trained on at most this many sentences, as tokenizer's
    min_frequency: int = 2
    block_size: int = 128  # tokens a block feeds the model; also the model's context (n_positions). GPT-2: 1024
    pretrain: GptPretrainConfig = field(default_factory=GptPretrainConfig)
    # A run that pretrains BERT too gives GPT its own model config here (defaults: /model@gpt.model: gpt_tiny), where
    # `model` holds BERT's; null: GPT's is `model`
    model: Optional[ModelConfig] = field(default=None, metadata={NULL_MEANS: "model"})


@dataclass
class GptReportConfig:
    """What GPT adds to `report`: the prompts its section continues (greedy)."""
    # openings in the style of the books (a tiny model has seen their words); in GPT's folder, as the block is its own:
    # a registry without GPT composes without it
    gpt_prompts: list[str] = field(default_factory=lambda: [
        "The old man", "It was a dark night, and", "She opened the letter and"])


FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section, validate=validate,
                config={"gpt": GptConfig, "report": GptReportConfig},
                numbers={"gpt.vocab_size": Number(int, MIN_VOCAB_SIZE, why=(
                    "byte-level BPE's 256 byte pieces and <|endoftext|>, which it keeps whatever the setting")),
                         "gpt.block_size": POSITIVE_INT, "gpt.max_sentences": Number(int, 1, nullable=True)})
