"""What the data functions write and the models read, defined once where both may import it: data_prep/ knows no model
and models/ no data function (tests/run/test_layering.py), and this package imports neither, nor torch.

IGNORE_INDEX, here; ELMo's word split and special words (elmo_words.py)."""

# The target value every loss skips (padding, unmasked positions, a word's later sub-tokens): F.cross_entropy's
# default ignore_index. data_prep writes it into labels, models and pipeline compare against it.
IGNORE_INDEX = -100
