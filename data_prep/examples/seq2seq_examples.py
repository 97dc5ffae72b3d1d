"""The encoder-decoder family's pretraining data: the books cut into blocks of whole sentences, each corrupted into a
source that the model learns to restore (the target), as a denoising autoencoder.

Three objectives, pure functions of their `rng` (a numpy Generator):
- BART's (Lewis et al. 2020, Sec. 2.2 and 5.1, the setting of its large model): sentence permutation (the block's
  sentences shuffled), then text infilling: span lengths drawn from Poisson(lambda=3) until 30 % of the tokens are
  covered, each span replaced by ONE mask token, a zero-length span inserting a mask. The target is the block as it
  was: the model must find which spans are missing, how long each is, and put the sentences back in order.
- T5's span corruption (Raffel et al. 2020, Sec. 3.1.4 and 3.7): 15 % of the tokens in spans of mean length 3, each
  span replaced by a sentinel (a different one per span, in order) in the source; the target is the sentinels, each
  followed by the span it replaced, and a final sentinel. The target is short: only the corrupted spans.
- PEGASUS's gap-sentence generation (Zhang et al. 2020, Sec. 3.1, 6.2 and Appendix, PEGASUS-large's "Mixed &
  Stochastic" setting): the block's most important sentences, each scored independently by ROUGE-1 F1 against the
  rest of the block ("Ind-Orig"), removed from the source, each replaced by one mask token; the target is those
  sentences, in order. Made for abstractive summarisation: a long source and a short target mostly copied or
  condensed from the rest, as a headline is, where BART's target is the whole block.

The tokenizer is GPT-2's byte-level BPE (data_prep/examples/gpt_blocks.py) trained with this family's special
tokens first.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from data_prep.corpus.shards import atomic_arrow_file
from data_prep.examples.gpt_blocks import TOKENIZER_FILE

PAD, BOS, EOS, MASK = "<pad>", "<s>", "</s>", "<mask>"  # ids 0-3: models.seq2seq's pad/start/end defaults are 0/1/2
OBJECTIVES = ("bart", "span_corruption", "gap_sentences")
EXAMPLE_SCHEMA = pa.schema([("source", pa.list_(pa.int32())), ("target", pa.list_(pa.int32()))])
BART_MASK_RATIO, BART_POISSON_LAMBDA = 0.3, 3.0  # Lewis et al. 2020, Sec. 5.1
T5_NOISE_DENSITY, T5_MEAN_SPAN = 0.15, 3.0  # Raffel et al. 2020, Sec. 3.7
# Zhang et al. 2020, Appendix (PEGASUS-large): the gap-sentence ratio drawn uniformly per block, the importance
# scores perturbed by 20 % uniform noise
GSG_RATIO_RANGE, GSG_SCORE_NOISE = (0.15, 0.45), 0.2


def sentinel(i: int) -> str:
    return f"<extra_id_{i}>"  # T5's names


def special_tokens(num_sentinels: int) -> list[str]:
    """The family's special tokens in id order: padding, start, end, mask, then the span-corruption sentinels."""
    return [PAD, BOS, EOS, MASK, *(sentinel(i) for i in range(num_sentinels))]


class SpecialIds(NamedTuple):
    pad: int
    bos: int
    eos: int
    mask: int
    sentinels: tuple[int, ...]


def special_ids(tokenizer: Tokenizer) -> SpecialIds:
    ids = [tokenizer.token_to_id(t) for t in (PAD, BOS, EOS, MASK)]
    if None in ids:
        raise ValueError(f"the tokenizer lacks {[PAD, BOS, EOS, MASK]}; train it with the seq2seq_tokenizer stage")
    sentinels = []
    while (i := tokenizer.token_to_id(sentinel(len(sentinels)))) is not None:
        sentinels.append(i)
    return SpecialIds(*ids, tuple(sentinels))


def load_seq2seq_tokenizer(directory: Path) -> Tokenizer:
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; run the seq2seq_tokenizer stage first")
    return Tokenizer.from_file(str(path))


# -----------------------------------------------------------------------------
# Blocks: contiguous whole sentences of one book


def sentence_blocks(sentences: Sequence[Sequence[int]], max_tokens: int) -> Iterator[list[list[int]]]:
    """The token lists of one book's sentences, in order, grouped into blocks of consecutive whole sentences of at
    most max_tokens tokens together; a sentence longer than that is cut to it and is a block of its own."""
    block, size = [], 0
    for sentence in sentences:
        sentence = list(sentence[:max_tokens])
        if not sentence:
            continue
        if block and size + len(sentence) > max_tokens:
            yield block
            block, size = [], 0
        block.append(sentence)
        size += len(sentence)
    if block:
        yield block


# -----------------------------------------------------------------------------
# BART


class Infilled(NamedTuple):
    source: list[int]
    spans: list[tuple[int, int]]  # (start in the original, length) of each span replaced by a mask, in order


def text_infilling(tokens: Sequence[int], mask_id: int, rng: np.random.Generator, ratio: float = BART_MASK_RATIO,
                   poisson_lambda: float = BART_POISSON_LAMBDA) -> Infilled:
    """BART's text infilling: spans whose lengths are drawn from Poisson(poisson_lambda) until round(ratio * n) tokens
    are covered (the last span cut to that total, as fairseq's denoising dataset does), placed at uniformly random
    non-overlapping positions, each replaced by one mask_id; a span of length 0 inserts a mask."""
    n = len(tokens)
    to_mask = int(round(ratio * n))
    lengths: list[int] = []
    while sum(lengths) < to_mask:
        lengths.append(int(rng.poisson(poisson_lambda)))
    if lengths:
        lengths[-1] -= sum(lengths) - to_mask
    # the n - to_mask kept tokens and the spans in a uniformly random order: which of the items are spans
    items = n - to_mask + len(lengths)
    is_span = np.zeros(items, dtype=bool)
    is_span[rng.choice(items, size=len(lengths), replace=False)] = True
    source, spans, position, span = [], [], 0, 0
    for item_is_span in is_span:
        if item_is_span:
            source.append(mask_id)
            spans.append((position, lengths[span]))
            position += lengths[span]
            span += 1
        else:
            source.append(tokens[position])
            position += 1
    return Infilled(source, spans)


def permute_sentences(sentences: Sequence[list[int]], rng: np.random.Generator) -> list[list[int]]:
    """BART's sentence permutation: the block's sentences in a uniformly random order."""
    return [sentences[i] for i in rng.permutation(len(sentences))]


def bart_example(sentences: Sequence[list[int]], ids: SpecialIds, rng: np.random.Generator) -> tuple[list, list]:
    """(source, target) of a block: the sentences permuted, then infilled, and the block as it was, each ending with
    the end token."""
    original = [t for s in sentences for t in s]
    noised = text_infilling([t for s in permute_sentences(sentences, rng) for t in s], ids.mask, rng).source
    return [*noised, ids.eos], [*original, ids.eos]


# -----------------------------------------------------------------------------
# T5


def random_segmentation(total: int, parts: int, rng: np.random.Generator) -> list[int]:
    """`total` split into `parts` positive lengths, uniformly among such splits (T5's _random_segmentation)."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
    return np.diff([0, *cuts, total]).tolist()


def span_corruption(tokens: Sequence[int], sentinel_ids: Sequence[int], rng: np.random.Generator,
                    noise_density: float = T5_NOISE_DENSITY, mean_span: float = T5_MEAN_SPAN) -> tuple[list, list]:
    """T5's span corruption (its random_spans_noise_mask): round(noise_density * n) tokens, at least 1 and at most
    n - 1, in round(noise / mean_span) spans (at least 1; at most one fewer than the sentinels, which the target's
    final sentinel needs), the spans and the kept stretches between them of uniformly random lengths, a kept stretch
    first. Source: the kept stretches, each span replaced by the next sentinel; target: each sentinel followed by its
    span, then the next sentinel (T5's layout: "<X> for inviting <Y> last <Z>")."""
    n = len(tokens)
    if n < 2:
        raise ValueError(f"span corruption needs at least 2 tokens, got {n}")
    if len(sentinel_ids) < 2:
        raise ValueError(f"span corruption needs at least 2 sentinel tokens, got {len(sentinel_ids)}; raise "
                         "seq2seq.num_sentinels")
    noise = min(max(int(round(noise_density * n)), 1), n - 1)
    spans = min(max(int(round(noise / mean_span)), 1), len(sentinel_ids) - 1, noise, n - noise)
    noise_lengths, kept_lengths = random_segmentation(noise, spans, rng), random_segmentation(n - noise, spans, rng)
    source, target, position = [], [], 0
    for i, (kept, noisy) in enumerate(zip(kept_lengths, noise_lengths)):
        source += [*tokens[position: position + kept], sentinel_ids[i]]
        position += kept
        target += [sentinel_ids[i], *tokens[position: position + noisy]]
        position += noisy
    return source, [*target, sentinel_ids[spans]]


# -----------------------------------------------------------------------------
# PEGASUS


def rouge1_f1(candidate: Sequence[int], reference: Sequence[int]) -> float:
    """ROUGE-1 F1 of two token lists, the token ids as unigrams counted with multiplicity: 2 * overlap / (|c| + |r|),
    which is 2PR / (P + R)."""
    overlap = sum((Counter(candidate) & Counter(reference)).values())
    return 2 * overlap / (len(candidate) + len(reference)) if overlap else 0.0


def principal_sentences(sentences: Sequence[Sequence[int]], m: int, rng: np.random.Generator,
                        noise: float = GSG_SCORE_NOISE) -> list[int]:
    """The indices, in order, of the block's m principal sentences by PEGASUS's Ind-Orig: each sentence scored
    independently by ROUGE-1 F1 against the rest of the block, the top m taken (Sec. 3.1, the strategy it found best,
    Sec. 6.2). Each score is multiplied by a factor drawn uniformly from [1 - noise, 1 + noise] (PEGASUS-large's
    stochastic sampling of the sentences, Appendix); noise=0 takes the top m exactly, ties to the earlier sentence."""
    scores = np.array([rouge1_f1(s, [t for j, other in enumerate(sentences) if j != i for t in other])
                       for i, s in enumerate(sentences)])
    if noise:
        scores = scores * rng.uniform(1 - noise, 1 + noise, size=len(scores))
    return sorted(np.argsort(-scores, kind="stable")[:m].tolist())


def gap_sentences(sentences: Sequence[list[int]], ids: SpecialIds, rng: np.random.Generator,
                  ratio_range: tuple[float, float] = GSG_RATIO_RANGE,
                  noise: float = GSG_SCORE_NOISE) -> tuple[list, list]:
    """PEGASUS's gap-sentence generation on a block of n >= 2 sentences: the gap-sentence ratio drawn uniformly from
    ratio_range, m = round(ratio * n) sentences, at least 1 and at most n - 1 (the source keeps some context), chosen
    by principal_sentences. Source: the block's sentences in order, each chosen one replaced by one mask token, then
    the end token; target: the chosen sentences in order, then the end token. A block of one sentence has no rest to
    score it against nor to restore it from: shard_examples skips it, as span corruption's blocks under 2 tokens."""
    n = len(sentences)
    if n < 2:
        raise ValueError(f"gap-sentence generation needs at least 2 sentences, got {n}")
    m = min(max(int(round(rng.uniform(*ratio_range) * n)), 1), n - 1)
    chosen = set(principal_sentences(sentences, m, rng, noise))
    source = [t for i, s in enumerate(sentences) for t in ([ids.mask] if i in chosen else s)]
    target = [t for i, s in enumerate(sentences) if i in chosen for t in s]
    return [*source, ids.eos], [*target, ids.eos]


# -----------------------------------------------------------------------------
# A shard's examples


def shard_examples(book_ids: list, sentences: list[str], tokenizer: Tokenizer, block_size: int, objective: str,
                   rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    """The (source, target) pairs of one sentence shard (rows in book order): each book's sentences tokenized, cut
    into blocks of whole sentences (sentence_blocks; a book that goes on in the next shard starts a block there) with
    room for the end token in block_size, each block corrupted by `objective` (OBJECTIVES). Targets are at most
    block_size tokens long and sources block_size + 1 (a BART source grows past its block only where zero-length spans
    outnumber the tokens masked; cut there)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"seq2seq.objective={objective!r} is not known; use one of {list(OBJECTIVES)}")
    ids = special_ids(tokenizer)
    examples = []
    for _, rows in groupby(zip(book_ids, sentences), key=lambda row: row[0]):  # one book's consecutive rows
        # a space before every sentence but the book's first, as in the book's text (byte-level BPE keeps spaces)
        texts = [sentence if i == 0 else " " + sentence for i, (_, sentence) in enumerate(rows)]
        encoded = [e.ids for e in tokenizer.encode_batch(texts)]
        for block in sentence_blocks(encoded, block_size - 1):
            if objective == "bart":
                source, target = bart_example(block, ids, rng)
            elif objective == "gap_sentences":
                if len(block) < 2:
                    continue
                source, target = gap_sentences(block, ids, rng)
            else:
                tokens = [t for s in block for t in s]
                if len(tokens) < 2:
                    continue
                source, target = span_corruption(tokens, ids.sentinels, rng)
                source, target = [*source, ids.eos], [*target, ids.eos]
            examples.append((source[: block_size + 1], target))
    return examples


def write_examples(examples: list[tuple[list[int], list[int]]], path: Path) -> None:
    table = pa.table([pa.array([s for s, _ in examples], type=pa.list_(pa.int32())),
                      pa.array([t for _, t in examples], type=pa.list_(pa.int32()))], schema=EXAMPLE_SCHEMA)
    with atomic_arrow_file(path, EXAMPLE_SCHEMA) as writer:
        writer.write_table(table)
