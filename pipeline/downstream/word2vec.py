"""The word2vec stage: word vectors trained with gensim on the run's own pretraining corpus (prepare's shards, after
decontamination), for the `w2v_mean` baseline of the fine-tune table.

Why a baseline of its own: at the compute of a CPU run (~10^14 FLOPs) a pretrained encoder must first beat what two
minutes of word2vec (Mikolov et al. 2013) on the same text give (the mean of a sentence's word vectors under a logistic
regression): "is my BERT better than word2vec on the same text?" is the honest bar, where bag-of-words and the random
twin only say whether the model learned anything. On 25,000 IMDb reviews it beat bag-of-words by 5-7 points with 300
labelled Rotten Tomatoes sentences (docs/pretraining_recipes.md).

The words are data_prep.tasks.senteval_data.tokenize's (lower-cased, punctuation split off), as for the bag-of-GloVe
probe.
Trained on one thread from a fixed seed and a stable hash of the words (gensim's default, Python's hash(), changes from
process to process), so the same corpus gives the same vectors.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.corpus.shards import shard_batches
from data_prep.corpus.word_vectors import WordVectors
from data_prep.tasks.senteval_data import tokenize
from pipeline.data_settings import chinese_words_of
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.settings import COUNT, POSITIVE_INT, ranged, typed_settings

WORDS_FILE, VECTORS_FILE = "words.txt", "vectors.npy"


@dataclass
class Word2VecConfig:
    """The `word2vec` block: the word2vec stage (gensim; Mikolov et al. 2013) of the w2v_mean baseline, trained on
    prepare's shards, at the settings of the bar in docs/pretraining_recipes.md (skip-gram, 100-d, window 5, 5 epochs);
    one thread, so the same corpus gives the same vectors."""
    vector_size: int = ranged(100, POSITIVE_INT)
    window: int = ranged(5, POSITIVE_INT)
    min_count: int = ranged(5, POSITIVE_INT)
    skip_gram: bool = True
    negative: int = ranged(5, COUNT)
    epochs: int = ranged(5, POSITIVE_INT)


def _stable_hash(word: str) -> int:
    return zlib.crc32(word.encode())


def write_line_sentences(shard_dir: Path, path: Path, chinese_words: str = "jieba") -> int:
    """The shards' sentences, tokenised, one per line as gensim's corpus_file reads them; returns the word count.
    From a file, not a Python list: gensim's fastest mode, and memory that does not grow with the corpus."""
    words = 0
    with open(path, "w", encoding="utf-8") as f:
        for batch in shard_batches(shard_dir):
            for sentence in batch.column("text").to_pylist():
                tokens = tokenize(sentence, chinese_words)
                words += len(tokens)
                f.write(" ".join(tokens) + "\n")
    return words


def train_word2vec(corpus_file: Path, settings: Word2VecConfig, seed: int, vector_size: int | None = None,
                   min_count: int | None = None) -> WordVectors:
    """Vectors of the words of `corpus_file` (one sentence per line, words separated by spaces) with the `word2vec`
    block's settings; `vector_size` and `min_count` in place of the block's where given."""
    from gensim.models import Word2Vec  # only the stages that train vectors need gensim

    min_count = settings.min_count if min_count is None else min_count
    model = Word2Vec(vector_size=vector_size or settings.vector_size, window=settings.window, min_count=min_count,
                     sg=int(settings.skip_gram), negative=settings.negative, epochs=settings.epochs, workers=1,
                     seed=seed, hashfxn=_stable_hash)
    # the raw counts kept, so that a min_count that empties the vocabulary is refused with them instead of gensim's
    # "you must first build vocabulary before training the model"
    model.build_vocab(corpus_file=str(corpus_file), keep_raw_vocab=True)
    if not model.wv.index_to_key:
        raise ValueError(empty_vocabulary_message(model.raw_vocab, min_count))
    model.raw_vocab = None
    model.train(corpus_file=str(corpus_file), total_examples=model.corpus_count, total_words=model.corpus_total_words,
                epochs=model.epochs, start_alpha=model.alpha, end_alpha=model.min_alpha)
    return WordVectors(tuple(model.wv.index_to_key), model.wv.vectors.astype(np.float32))


def empty_vocabulary_message(counts: dict[str, int], min_count: int) -> str:
    """Why word2vec has no word to train, from the corpus's word counts, and the word2vec.min_count that would work."""
    if not counts:
        return "word2vec: the corpus has no words to train vectors of; check data.corpus_dir and the prepare stage"
    most = max(counts.values())
    return (f"word2vec.min_count={min_count} leaves no vocabulary: the corpus has {len(counts):,} distinct words and "
            f"none occurs {min_count} times or more (the most frequent, {max(counts, key=counts.get)!r}, occurs "
            f"{most} times); set word2vec.min_count={most} or lower, or give the corpus more text")


def load_word2vec(stage_dir: Path) -> WordVectors:
    words = (stage_dir / WORDS_FILE).read_text(encoding="utf-8").split("\n")
    return WordVectors(tuple(words), np.load(stage_dir / VECTORS_FILE))


def word2vec(ctx: StageContext) -> dict:
    started = time.perf_counter()
    chinese_words = chinese_words_of(ctx.cfg)
    with ctx.scratch_dir() as scratch:
        corpus_file = scratch / "sentences.txt"
        words = write_line_sentences(ctx.stage_dir("prepare"), corpus_file, chinese_words)
        vectors = train_word2vec(corpus_file, typed_settings(ctx.cfg.word2vec, Word2VecConfig), ctx.cfg.seed)
    (ctx.out_dir / WORDS_FILE).write_text("\n".join(vectors.words), encoding="utf-8")
    np.save(ctx.out_dir / VECTORS_FILE, vectors.vectors)
    summary = {"corpus_words": words, "vocabulary": len(vectors.words), "vector_size": vectors.vectors.shape[1],
               "seconds": round(time.perf_counter() - started, 1)}
    print(f"word2vec: {summary['vocabulary']} words of {words} in the corpus, {summary['seconds']} s", flush=True)
    return summary


WORD2VEC = Stage("word2vec", word2vec, ("prepare",), ("word2vec", "seed"))
