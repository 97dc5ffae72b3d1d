"""Skip-Thought (Kiros et al. 2015): its stages, uni-skip's and bi-skip's pretraining among them, and the trained
encoders, combine-skip too, for `evaluate` and, frozen under a linear model, for `finetune`."""
from dataclasses import dataclass

from data_prep.examples.skip_thought_examples import SPECIAL_WORDS
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.skip_thought.downstream import FINETUNE_KINDS
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.stages import PRETRAINING_STAGES, SKIP_THOUGHT_STAGES, validate


@dataclass
class SkipThoughtConfig:
    """The `skip_thought` block (experiment=skip_thought_*): Skip-Thought's word vocabulary and sentence length."""
    vocab_size: int = 8000  # paper: 20000
    min_count: int = 1
    max_words: int = 30  # Kiros et al.'s code: sentences of at most 30 words


FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES),
                pretraining_stages=tuple(PRETRAINING_STAGES.values()), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, validate=validate,
                config={"skip_thought": SkipThoughtConfig}, numbers={
                    "skip_thought.max_words": POSITIVE_INT,
                    "skip_thought.vocab_size": Number(int, len(SPECIAL_WORDS) + 1, why=(
                        f"its special words {', '.join(SPECIAL_WORDS)} and at least one word"))})
