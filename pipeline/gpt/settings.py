"""GPT's block as its data stages read it (`gpt`'s tokenizer and block keys), and what it adds to `finetune` and
`report`, typed, in a module without torch, which the Ray workers of those stages never load
(tests/run/test_layering.py). The whole `gpt` block, with GPT's own pretraining settings and model, is GptConfig
(pipeline/gpt/stages.py)."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class GptDataConfig:
    """Byte-level BPE and packed blocks (data_prep/examples/gpt_blocks.py)."""
    vocab_size: int = 8000  # GPT-2: 50257
    max_sentences: Optional[int] = 1_000_000  # the BPE is trained on at most this many sentences, as tokenizer's
    min_frequency: int = 2
    block_size: int = 128  # tokens a block feeds the model; also the model's context (n_positions). GPT-2: 1024


@dataclass
class GptFinetuneConfig:
    """What GPT's fine-tuning adds to `finetune`."""
    # λ of GPT-1's auxiliary objective (Radford et al. 2018, Sec. 3.2): a sentence (pair) classifier's loss adds λ x
    # the next-token loss of the task's own text, which the paper found to improve generalisation and speed up
    # convergence; 0.5 there (Sec. 4.1). 0: the task's loss alone, and the LM head's product over the vocabulary is
    # not computed.
    lm_loss_weight: float = 0.5


@dataclass
class GptReportConfig:
    """What GPT adds to `report`: the prompts its section continues (greedy)."""
    # openings in the style of the books (a tiny model has seen their words); in GPT's folder, as the block is its own:
    # a registry without GPT composes without it
    gpt_prompts: list[str] = field(default_factory=lambda: [
        "The old man", "It was a dark night, and", "She opened the letter and"])
