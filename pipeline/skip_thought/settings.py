"""The `skip_thought` block, typed: what Skip-Thought's data stages read, in a module without torch, which the Ray
workers of those stages never load (tests/run/test_layering.py), and what its pretraining stages train."""
from dataclasses import dataclass
from enum import StrEnum

from data_prep.examples.skip_thought_examples import SPECIAL_WORDS
from pipeline.engine.settings import POSITIVE_INT, Number, ranged

# skip_thought.objective: what trains the encoder (models.skip_thought.OBJECTIVES; the model class it builds)
Objective = StrEnum("Objective", {name: name for name in ("skip_thought", "quick_thought")}, module=__name__)


@dataclass
class SkipThoughtConfig:
    """The `skip_thought` block (experiment=skip_thought_*): Skip-Thought's word vocabulary and sentence length, and
    the objective its pretraining stages train with."""
    vocab_size: int = ranged(8000, Number(int, len(SPECIAL_WORDS) + 1, why=(  # paper: 20000
        f"its special words {', '.join(SPECIAL_WORDS)} and at least one word")))
    min_count: int = 1
    max_words: int = ranged(30, POSITIVE_INT)  # Kiros et al.'s code: sentences of at most 30 words
    # skip_thought: the previous and next sentences decoded word by word (Kiros et al. 2015); quick_thought: each
    # sentence picks its two neighbours out of the batch's candidates by inner products (Logeswaran & Lee 2018, who
    # report MR 80.4 against Skip-Thought's 76.5 at a fraction of the training time), no decoder
    objective: Objective = Objective.skip_thought
