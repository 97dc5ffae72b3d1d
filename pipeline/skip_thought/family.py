"""Skip-Thought (Kiros et al. 2015): its stages and the trained encoder for `evaluate`."""
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.stages import SKIP_THOUGHT_STAGES

FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES), pretraining_stages=("skip_thought_pretrain",),
                encoders=ENCODERS, numbers={"skip_thought.max_words": POSITIVE_INT})
