"""Classic baselines of the fine-tune table, next to majority class: without one a reader cannot tell whether a
neural row is any good. `bow_logreg`: TF-IDF of word uni- and bigrams (a bag-of-words logistic regression reaches
~0.77 on MR; Wang & Manning 2012). `w2v_mean`: the mean of a sentence's word2vec vectors, trained on the run's own
pretraining corpus (pipeline/downstream/word2vec.py): what a pretrained encoder must beat to have earned its compute.
Both are fitted on the same labelled subsets as the model kinds, at every train size and seed."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from data_prep.corpus.chinese import CJK_IDEOGRAPHS
from data_prep.corpus.word_vectors import WordVectors
from data_prep.tasks.senteval_data import tokenize
from pipeline.downstream.tasks import TaskSplit, scoring_options
from pipeline.evaluation.metrics import score_task

# Inverse L2 strengths tried; chosen by the mean accuracy of stratified 5-fold cross-validation on train only.
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)


def _sides(split: TaskSplit) -> list[list[str]]:
    return [split.texts_a] + ([split.texts_b] if split.texts_b is not None else [])


def _fit_and_score(task: DictConfig, train_features, train_labels: list[int], dev_features, dev: TaskSplit,
                   seed: int) -> dict[str, float]:
    """A logistic regression, its L2 strength chosen by stratified cross-validation on train (where a class has two
    examples), scored on dev by the task's metric. Fitted on one BLAS thread: lbfgs's sums in another order reached
    another optimum and, through the fold scores, another C (bow_logreg on all of Rotten Tomatoes, seed 2: 0.7831 on
    one thread, 0.7764 on two), so a row depended on the thread count of the Ray worker that ran it."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _fit_and_score_on_this_thread(task, train_features, train_labels, dev_features, dev, seed)


def _fit_and_score_on_this_thread(task: DictConfig, train_features, train_labels: list[int], dev_features,
                                  dev: TaskSplit, seed: int) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(train_labels)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) == 1:  # finetune.train_sizes below the number of labels: a classifier of one class predicts it
        return score_task(task.metric, [int(classes[0])] * len(dev.labels), dev.labels)
    if counts.max() < 2:  # one example of each class: no stratified folds to choose C by, so scikit-learn's default
        model = LogisticRegression(C=1.0, max_iter=1000)
        model.fit(train_features, labels)
        return score_task(task.metric, model.predict(dev_features).tolist(), dev.labels)
    # stratified folds need each class in every fold: fewer folds for a tiny train split (two at least)
    folds = max(2, min(5, int(counts.min())))
    model = LogisticRegressionCV(Cs=list(C_GRID), cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
                                 scoring="accuracy", max_iter=1000, n_jobs=1,
                                 l1_ratios=(0.0,), use_legacy_attributes=False)  # plain L2, as 1.10 will default
    model.fit(train_features, labels)
    return score_task(task.metric, model.predict(dev_features).tolist(), dev.labels)


# scikit-learn's default token pattern, \b\w\w+\b (words of two or more word characters), and each CJK ideograph a
# token of its own: a run of Chinese was one "word", so a Chinese sentence was one feature. Chinese text thus gets
# character unigrams and bigrams, the bag of character n-grams Chinese text classification baselines use (Zhang et al.
# 2015's character-level comparisons; bigrams catch most two-character words), English its words as before.
BOW_TOKEN = f"[{CJK_IDEOGRAPHS}]|[^\\W{CJK_IDEOGRAPHS}]{{2,}}"


def bow_logreg_scores(task: DictConfig, train: TaskSplit, dev: TaskSplit, seed: int) -> dict[str, float]:
    """TF-IDF of word (Chinese: character) unigrams and bigrams and a logistic regression. A pair task's two texts are
    vectorised with one vocabulary (fitted on both sides of train) and their vectors concatenated, so a word can weigh
    differently in the first and the second text."""
    # scikit-learn (and its scipy) load only when a baseline is fitted: the other stages never need them
    import scipy.sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), token_pattern=BOW_TOKEN)
    vectorizer.fit([text for side in _sides(train) for text in side])

    def features(split: TaskSplit):
        return scipy.sparse.hstack([vectorizer.transform(texts) for texts in _sides(split)]).tocsr()

    return _fit_and_score(task, features(train), train.labels, features(dev), dev, seed)


def mean_word_vectors(texts: list[str], vectors: WordVectors, chinese_words: str = "jieba") -> np.ndarray:
    """(N, d): each text's mean word vector over its words in the vocabulary (zeros when it has none)."""
    out = np.zeros((len(texts), vectors.vectors.shape[1]), dtype=np.float32)
    for i, text in enumerate(texts):
        known = [vectors.index[w] for w in tokenize(text, chinese_words) if w in vectors.index]
        if known:
            out[i] = vectors.vectors[known].mean(axis=0)
    return out


def word_coverage(texts: list[str], vectors: WordVectors, chinese_words: str = "jieba") -> float:
    """The share of the words of `texts` that have a vector: what of a text its mean word vector sees. Words are the
    tokens with a letter or a digit; punctuation is left out, so a vocabulary of '.' alone covers nothing."""
    words = [w for text in texts for w in tokenize(text, chinese_words) if any(c.isalnum() for c in w)]
    return sum(w in vectors.index for w in words) / len(words) if words else 0.0


def w2v_mean_coverage(task_name: str, train: TaskSplit, dev: TaskSplit, vectors: WordVectors, min_coverage: float,
                      chinese_words: str = "jieba") -> dict:
    """w2v_mean's coverage of the task's words (both splits, both texts of a pair), for its rows; below
    `min_coverage` (finetune.w2v_min_coverage) also a warning, printed here and kept beside the rows for the
    report."""
    coverage = word_coverage([text for split in (train, dev) for side in _sides(split) for text in side], vectors,
                             chinese_words)
    summary = {"coverage": round(coverage, 4)}
    if coverage < min_coverage:
        summary["coverage_warning"] = (
            f"w2v_mean covers {coverage:.1%} of the words of task {task_name}, below finetune.w2v_min_coverage="
            f"{min_coverage}: its features are the mean of a few words of a sentence, or zeros, so its score is not "
            f"what word2vec learned (its vocabulary: {len(vectors.words):,}); pretrain on more text (or text nearer "
            "the task), or lower word2vec.min_count")
        print(f"WARNING: {summary['coverage_warning']}", flush=True)
    return summary


def w2v_mean_scores(task: DictConfig, train: TaskSplit, dev: TaskSplit, seed: int,
                    vectors: WordVectors, chinese_words: str = "jieba") -> dict[str, float]:
    """The mean word vector of each text (a pair's two concatenated), standardised with train's statistics, and a
    logistic regression; words split as the word2vec stage split them (`chinese_words`)."""
    def features(split: TaskSplit) -> np.ndarray:
        return np.hstack([mean_word_vectors(texts, vectors, chinese_words) for texts in _sides(split)])

    train_features = features(train)
    mean, std = train_features.mean(axis=0), train_features.std(axis=0) + 1e-6
    return _fit_and_score(task, (train_features - mean) / std, train.labels, (features(dev) - mean) / std, dev,
                          seed)


# lead-N: N tried from 1 to this many words (the BBC headlines average 5)
LEAD_MAX_WORDS = 20


def lead(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def lead_n_scores(task: DictConfig, train: TaskSplit, dev: TaskSplit) -> tuple[int, dict[str, float]]:
    """The lead baseline of a generation task, the classic one of summarisation (Nenkova 2005; See et al. 2017's
    lead-3): the source's first N words as the output, N chosen on train by the mean ROUGE-L F1 it gets there, then
    (N, the dev scores of the task's metric)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

    def train_rouge_l(n: int) -> float:
        return float(np.mean([scorer.score(target, lead(source, n))["rougeL"].fmeasure
                              for source, target in zip(train.texts_a, train.labels)]))

    best = max(range(1, LEAD_MAX_WORDS + 1), key=train_rouge_l)
    return best, score_task(task.metric, [lead(source, best) for source in dev.texts_a], dev.labels,
                            **scoring_options(task))
