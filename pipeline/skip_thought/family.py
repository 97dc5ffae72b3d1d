"""Skip-Thought (Kiros et al. 2015): its stages, uni-skip's and bi-skip's pretraining among them, and the trained
encoders, combine-skip too, for `evaluate` and, frozen under a linear model, for `finetune`."""
from data_prep.examples.skip_thought_examples import SPECIAL_WORDS
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number
from pipeline.skip_thought.downstream import FINETUNE_KINDS
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.settings import SkipThoughtConfig
from pipeline.skip_thought.stages import PRETRAINING_STAGES, SKIP_THOUGHT_STAGES, validate

FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES),
                pretraining_stages=tuple(PRETRAINING_STAGES.values()), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, validate=validate,
                config={"skip_thought": SkipThoughtConfig}, numbers={
                    "skip_thought.max_words": POSITIVE_INT,
                    "skip_thought.vocab_size": Number(int, len(SPECIAL_WORDS) + 1, why=(
                        f"its special words {', '.join(SPECIAL_WORDS)} and at least one word"))})
