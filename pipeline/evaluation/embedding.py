"""Sentences into vectors by the SentEval encoder protocol (pipeline/evaluation/senteval.py): embed() checks what
an encoder returns, and GloveBagOfWords is the protocol's bag-of-words baseline."""
from __future__ import annotations

import numpy as np

from data_prep.corpus.word_vectors import WordVectors
from pipeline.engine.family import Encoder


class GloveBagOfWords:
    """Mean of the word vectors of a sentence's known words: SentEval's bow.py baseline (seed 000). A sentence with
    no known word gets the zero vector, as in bow.py. GloVe 6B 50-d: GloveBagOfWords(word_vectors.load_glove())."""

    def __init__(self, vectors: WordVectors, name: str = "glove_bow"):
        self.vectors = vectors
        self.name = name
        self._table: dict[str, np.ndarray] | None = None

    def prepare(self, samples: list[list[str]]) -> None:
        # As bow.py: keep only the task's words.
        known = sorted({word for sentence in samples for word in sentence if word in self.vectors})
        if not known:
            raise ValueError(f"{self.name}: no word of the task has a vector; the vectors must be keyed by "
                             "lowercased tokens as data_prep.tasks.senteval_data.tokenize produces them")
        self._table = dict(zip(known, self.vectors.rows(known).astype(np.float32)))
        self._dim = self.vectors.vectors.shape[1]

    def batcher(self, batch: list[list[str]]) -> np.ndarray:
        if self._table is None:
            raise RuntimeError(f"{self.name}: call prepare(samples) with the task's sentences before batcher")
        out = np.zeros((len(batch), self._dim), dtype=np.float32)
        for i, sentence in enumerate(batch):
            known = [self._table[w] for w in sentence if w in self._table]
            if known:
                out[i] = np.mean(known, axis=0)
        return out


def embed(encoder: Encoder, sentences: list[list[str]], batch_size: int) -> np.ndarray:
    """(N, D) embeddings of `sentences` through encoder.batcher: each distinct sentence once, batches of sentences
    sorted by length (SentEval's engine does the same to cut padding)."""
    if not sentences:
        raise ValueError(f"encoder {encoder.name}: no sentences to embed; the task's data is empty")
    distinct = list(dict.fromkeys(map(tuple, sentences)))
    order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
    chunks = []
    for start in range(0, len(order), batch_size):
        batch = [list(distinct[i]) for i in order[start: start + batch_size]]
        vectors = np.asarray(encoder.batcher(batch), dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(batch) or (chunks and vectors.shape[1] != chunks[0].shape[1]):
            expected = f"({len(batch)}, {chunks[0].shape[1] if chunks else 'D'})"
            raise ValueError(f"encoder {encoder.name}: batcher returned shape {vectors.shape} for a batch of "
                             f"{len(batch)} sentences; it must return {expected}, one row per sentence")
        if not np.isfinite(vectors).all():
            raise ValueError(f"encoder {encoder.name}: batcher returned NaN or infinite values")
        chunks.append(vectors)
    table = np.empty((len(distinct), chunks[0].shape[1]), dtype=np.float32)
    table[order] = np.concatenate(chunks)
    index = {sentence: i for i, sentence in enumerate(distinct)}
    return table[[index[tuple(s)] for s in sentences]]
