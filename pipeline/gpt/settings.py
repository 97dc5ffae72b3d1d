"""GPT's blocks, typed: `gpt` (GptConfig: its data stages' keys, GPT's own pretraining settings and model) and what it
adds to `finetune` and `report`, in a module without torch: the Ray workers of its data stages read GptDataConfig here
and never load it (tests/run/test_layering.py)."""
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from conventions import GPT_POOLINGS
from data_prep.examples.gpt_blocks import MIN_VOCAB_SIZE
from pipeline.engine.settings import POSITIVE_INT, Number, ranged
from pipeline.schema import NULL_MEANS, ModelConfig, PretrainConfig, override_block


@dataclass
class GptDataConfig:
    """Byte-level BPE and packed blocks (data_prep/examples/gpt_blocks.py)."""
    vocab_size: int = ranged(8000, Number(int, MIN_VOCAB_SIZE, why=(  # GPT-2: 50257
        "byte-level BPE's 256 byte pieces and <|endoftext|>, which it keeps whatever the setting")))
    # the BPE is trained on at most this many sentences, as tokenizer's
    max_sentences: Optional[int] = ranged(1_000_000, Number(int, 1, nullable=True))
    min_frequency: int = 2
    # tokens a block feeds the model; also the model's context (n_positions). GPT-2: 1024
    block_size: int = ranged(128, POSITIVE_INT)


GptPooling = StrEnum("GptPooling", {name: name for name in GPT_POOLINGS}, module=__name__)


# GPT's own pretraining settings, gpt.pretrain: pretrain's keys, null where GPT keeps pretrain's value. What a run that
# pretrains BERT too gives GPT alone (experiment=bert_vs_gpt: gpt.pretrain.lr=1e-3).
GptPretrainConfig = override_block("GptPretrainConfig", __name__, (PretrainConfig,))


@dataclass
class GptConfig(GptDataConfig):
    """The `gpt` block (experiment=gpt_*): its data stages' keys, GPT's own pretraining settings and model."""
    pretrain: GptPretrainConfig = field(default_factory=GptPretrainConfig)
    # A run that pretrains BERT too gives GPT its own model config here (defaults: /model@gpt.model: gpt_tiny), where
    # `model` holds BERT's; null: GPT's is `model`
    model: Optional[ModelConfig] = field(default=None, metadata={NULL_MEANS: "model"})


@dataclass
class GptFinetuneConfig:
    """What GPT's fine-tuning adds to `finetune`."""
    # λ of GPT-1's auxiliary objective (Radford et al. 2018, Sec. 3.2): a sentence (pair) classifier's loss adds λ x
    # the next-token loss of the task's own text, which the paper found to improve generalisation and speed up
    # convergence; 0.5 there (Sec. 4.1). 0: the task's loss alone, and the LM head's product over the vocabulary is
    # not computed.
    lm_loss_weight: float = ranged(0.5, Number(float, 0))
    # What a sentence (pair) classifier's head reads of each sequence (GPT_POOLINGS, models.gpt's
    # GPTForSequenceClassification): GPT-1's extract state (last), the mean of the final states (mean), or the extract
    # state beside the mean of the token embeddings (last_embedding_mean). For gpt, gpt_random and gpt_w2v alike.
    # GPT-1's stays the default: on the reviews' selection split (gpt_tiny, seeds 1-3) mean lost 2.3-2.6 points at
    # every size and last_embedding_mean was level with it (−0.2 at 1,000 labels; docs/pretraining_recipes.md,
    # "GPT's levers")
    gpt_pooling: GptPooling = GptPooling.last


@dataclass
class GptReportConfig:
    """What GPT adds to `report`: the prompts its section continues (greedy)."""
    # openings in the style of the books (a tiny model has seen their words); in GPT's folder, as the block is its own:
    # a registry without GPT composes without it
    gpt_prompts: list[str] = field(default_factory=lambda: [
        "The old man", "It was a dark night, and", "She opened the letter and"])
