"""The `skip_thought` block, typed: what Skip-Thought's data stages read, in a module without torch, which the Ray
workers of those stages never load (tests/run/test_layering.py)."""
from dataclasses import dataclass


@dataclass
class SkipThoughtConfig:
    """The `skip_thought` block (experiment=skip_thought_*): Skip-Thought's word vocabulary and sentence length."""
    vocab_size: int = 8000  # paper: 20000
    min_count: int = 1
    max_words: int = 30  # Kiros et al.'s code: sentences of at most 30 words
