"""The piece-vector table as the piece-vector stage writes it (pipeline/piece_vectors.py) and pretraining and
fine-tuning read it (pipeline/engine/pretraining.py, each family's start): one row per token id, NaN for a piece the
corpus never shows. Here because the stage that writes it loads no torch and the engine that reads it knows no stage."""
import numpy as np


def pieces_with_vectors(vectors: np.ndarray) -> np.ndarray:
    """Which token ids have a piece vector (a bool per row of the table)."""
    return ~np.isnan(vectors).any(axis=1)
