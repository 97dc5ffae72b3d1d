"""Plain nn.Modules, one file per family, and the checkpoint layout they share. Nothing here imports pipeline/ or
data_prep/ (tests/test_layering.py): the data and pipeline code read the models' constants, never the reverse."""

# The target value every loss here skips (padding, unmasked positions, a word's later sub-tokens): F.cross_entropy's
# default ignore_index. data_prep writes it into labels, models and pipeline compare against it.
IGNORE_INDEX = -100
