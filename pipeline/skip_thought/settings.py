"""The `skip_thought` block, typed: what Skip-Thought's data stages read, in a module without torch, which the Ray
workers of those stages never load (tests/run/test_layering.py)."""
from dataclasses import dataclass

from data_prep.examples.skip_thought_examples import SPECIAL_WORDS
from pipeline.engine.settings import POSITIVE_INT, Number, ranged


@dataclass
class SkipThoughtConfig:
    """The `skip_thought` block (experiment=skip_thought_*): Skip-Thought's word vocabulary and sentence length."""
    vocab_size: int = ranged(8000, Number(int, len(SPECIAL_WORDS) + 1, why=(  # paper: 20000
        f"its special words {', '.join(SPECIAL_WORDS)} and at least one word")))
    min_count: int = 1
    max_words: int = ranged(30, POSITIVE_INT)  # Kiros et al.'s code: sentences of at most 30 words
