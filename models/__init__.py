"""Plain nn.Modules, one file per family, and the checkpoint layout they share. Nothing here imports pipeline/ or
data_prep/ (tests/run/test_layering.py): the data and pipeline code read the models' constants, never the reverse; what
the data functions and the models both need is in conventions/."""
from conventions import IGNORE_INDEX  # noqa: F401  the label every loss here skips, as models.IGNORE_INDEX
