"""Skip-Thought (Kiros et al. 2015): its stages, uni-skip's and bi-skip's pretraining among them, and the trained
encoders, combine-skip too, for `evaluate`."""
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.stages import PRETRAINING_STAGES, SKIP_THOUGHT_STAGES, validate

FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES),
                pretraining_stages=tuple(PRETRAINING_STAGES.values()), encoders=ENCODERS, validate=validate,
                numbers={"skip_thought.max_words": POSITIVE_INT})
