"""The seq2seq family's pretraining pairs (data_prep/examples/seq2seq_examples.py): BART's text infilling and sentence
permutation, T5's span corruption, PEGASUS's gap sentences, measured against the papers' settings over many draws, and
one shard's pairs."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from data_prep.examples.gpt_blocks import train_byte_level_bpe
from data_prep.examples.seq2seq_examples import (
    EOS,
    MASK,
    bart_example,
    gap_sentences,
    permute_sentences,
    principal_sentences,
    rouge1_f1,
    sentence_blocks,
    sentinel,
    shard_examples,
    span_corruption,
    special_ids,
    special_tokens,
    text_infilling,
)
from tests.helpers import write_books

MASK_ID = 3
SENTINELS = list(range(4, 104))


def infill_many(n: int = 200, draws: int = 300):
    rng = np.random.default_rng(0)
    for _ in range(draws):
        tokens = rng.integers(200, 1000, size=n).tolist()
        yield tokens, text_infilling(tokens, MASK_ID, rng)


def test_text_infilling_masks_30_percent_in_poisson_3_spans_one_mask_each():
    lengths, fractions = [], []
    for tokens, (source, spans) in infill_many():
        assert source.count(MASK_ID) == len(spans)  # one mask per span, a zero-length one included
        fractions.append(sum(length for _, length in spans) / len(tokens))
        lengths += [length for _, length in spans]
        # the source is the original with each span, in order, replaced by its mask
        rebuilt, position, masks = [], 0, iter(spans)
        for token in source:
            if token == MASK_ID:
                start, length = next(masks)
                assert start >= position
                rebuilt += tokens[position: start + length]
                position = start + length
            else:
                rebuilt.append(tokens[position])
                assert token == tokens[position]
                position += 1
        assert rebuilt + tokens[position:] == tokens and position == len(tokens)
    assert np.mean(fractions) == pytest.approx(0.3, abs=0.003)  # round(0.3 n) of n = 200: exactly 0.3
    assert np.mean(lengths) == pytest.approx(3.0, abs=0.15)  # Poisson(3), its last draw cut to the total
    assert Counter(lengths)[0] / len(lengths) == pytest.approx(np.exp(-3), abs=0.02)  # zero-length: mask inserted


def test_text_infilling_leaves_a_short_text_with_nothing_to_mask_alone():
    assert text_infilling([7], MASK_ID, np.random.default_rng(0)).source == [7]  # round(0.3) = 0


def test_sentence_permutation_keeps_the_sentences_and_shuffles_their_order():
    sentences = [[i, i + 100] for i in range(8)]
    orders = set()
    for seed in range(20):
        permuted = permute_sentences(sentences, np.random.default_rng(seed))
        assert sorted(permuted) == sentences
        orders.add(tuple(s[0] for s in permuted))
    assert len(orders) > 10


def test_a_bart_pair_restores_the_block_from_its_permuted_infilled_source():
    ids = special_ids_stub()
    sentences = [[10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34]]
    source, target = bart_example(sentences, ids, np.random.default_rng(1))
    assert target == [*sum(sentences, []), ids.eos] and source[-1] == ids.eos
    kept = Counter(t for t in source[:-1] if t != ids.mask)
    assert not kept - Counter(target) and sum(kept.values()) == len(target) - 1 - round(0.3 * 12)


def special_ids_stub():
    from data_prep.examples.seq2seq_examples import SpecialIds

    return SpecialIds(0, 1, 2, MASK_ID, tuple(SENTINELS))


def reassemble(source: list[int], target: list[int]) -> list[int]:
    """The original text of a span-corruption pair: each sentinel of the source replaced by what follows it in the
    target, up to the next sentinel."""
    spans, current = {}, None
    for token in target:
        if token in SENTINELS:
            current = spans.setdefault(token, [])
        else:
            current.append(token)
    return [t for token in source for t in (spans[token] if token in SENTINELS else [token])]


def test_span_corruption_source_and_target_reassemble_to_the_original_with_15_percent_in_mean_3_spans():
    rng = np.random.default_rng(0)
    densities, lengths = [], []
    for _ in range(300):
        tokens = rng.integers(200, 1000, size=int(rng.integers(20, 200))).tolist()
        source, target = span_corruption(tokens, SENTINELS, rng)
        assert reassemble(source, target) == tokens
        used = [t for t in target if t in SENTINELS]
        assert used == SENTINELS[: len(used)] and target[-1] == SENTINELS[len(used) - 1]  # in order, a final one
        assert [t for t in source if t in SENTINELS] == used[:-1]
        densities.append((len(target) - len(used)) / len(tokens))
        lengths.append((len(target) - len(used)) / (len(used) - 1))
    assert np.mean(densities) == pytest.approx(0.15, abs=0.01)
    assert np.mean(lengths) == pytest.approx(3.0, abs=0.3)


def test_span_corruption_uses_no_more_spans_than_it_has_sentinels():
    tokens = list(range(200, 1200))
    source, target = span_corruption(tokens, SENTINELS[:5], np.random.default_rng(0))
    assert reassemble(source, target) == tokens and sum(t in SENTINELS for t in target) == 5
    with pytest.raises(ValueError, match="raise seq2seq.num_sentinels"):
        span_corruption(tokens, SENTINELS[:1], np.random.default_rng(0))


def test_rouge1_f1_counts_unigrams_with_multiplicity():
    assert rouge1_f1([5, 5, 6], [5, 6, 6, 7]) == pytest.approx(2 * 2 / 7)  # overlap {5, 6}: P 2/3, R 2/4
    assert rouge1_f1([5], [6]) == 0.0


# a block whose second sentence sums up the others: it shares a word with each of them
SUMMARY_BLOCK = [[10, 11, 12, 13], [10, 20, 30, 40, 50], [20, 21, 22, 23], [30, 31, 32], [40, 41, 42, 43], [50, 51]]


def test_the_principal_sentence_without_noise_is_the_one_closest_to_the_rest():
    assert principal_sentences(SUMMARY_BLOCK, 1, np.random.default_rng(0), noise=0) == [1]
    top2 = principal_sentences(SUMMARY_BLOCK, 2, np.random.default_rng(0), noise=0)
    scores = [rouge1_f1(s, [t for j, o in enumerate(SUMMARY_BLOCK) if j != i for t in o])
              for i, s in enumerate(SUMMARY_BLOCK)]
    assert 1 in top2 and min(scores[i] for i in top2) >= max(s for i, s in enumerate(scores) if i not in top2)


def check_gap_sentence_pair(sentences, source, target, ids) -> list[int]:
    """The chosen sentences' indices, once the pair is checked: the source is the block with each chosen sentence
    replaced by one mask, every other sentence unchanged and in order; the target the chosen ones in order."""
    assert source[-1] == target[-1] == ids.eos
    chosen, position = [], 0
    for i, sentence in enumerate(sentences):
        if source[position] == ids.mask:
            chosen.append(i)
            position += 1
        else:
            assert source[position: position + len(sentence)] == sentence
            position += len(sentence)
    assert position == len(source) - 1
    assert target == [*(t for i in chosen for t in sentences[i]), ids.eos]
    return chosen


def test_a_gap_sentence_pair_masks_the_principal_sentence_and_generates_it():
    ids = special_ids_stub()
    source, target = gap_sentences(SUMMARY_BLOCK, ids, np.random.default_rng(0), ratio_range=(0.1, 0.1), noise=0)
    assert check_gap_sentence_pair(SUMMARY_BLOCK, source, target, ids) == [1]  # round(0.6) = 1: the summary
    assert target == [10, 20, 30, 40, 50, ids.eos]
    assert source == [10, 11, 12, 13, ids.mask, 20, 21, 22, 23, 30, 31, 32, 40, 41, 42, 43, 50, 51, ids.eos]


def test_gap_sentences_mask_15_to_45_percent_of_the_sentences_in_order_seeded_by_the_rng():
    ids, rng = special_ids_stub(), np.random.default_rng(0)
    counts, chosen_sets = Counter(), set()
    for _ in range(500):
        n = int(rng.integers(2, 12))
        sentences = [rng.integers(200, 230, size=int(rng.integers(1, 10))).tolist() for _ in range(n)]
        source, target = gap_sentences(sentences, ids, rng)
        chosen = check_gap_sentence_pair(sentences, source, target, ids)
        assert max(1, round(0.15 * n)) <= len(chosen) <= min(n - 1, round(0.45 * n))
        counts[n, len(chosen)] += 1
        chosen_sets.add(tuple(chosen))
    assert {m for (n, m) in counts if n == 10} == {2, 3, 4}  # 10 sentences: 1.5-4.5, rounded
    assert counts[2, 1] > 0 and not any(m == n for n, m in counts)
    assert gap_sentences(SUMMARY_BLOCK, ids, np.random.default_rng(7)) == gap_sentences(
        SUMMARY_BLOCK, ids, np.random.default_rng(7))
    # a ratio that would take the whole block leaves one sentence of context
    source, target = gap_sentences([[10], [11]], ids, rng, ratio_range=(0.9, 0.9))
    assert source.count(ids.mask) == 1 and len(source) == 3 and len(target) == 2
    with pytest.raises(ValueError, match="at least 2 sentences"):
        gap_sentences([[10, 11]], ids, np.random.default_rng(0))


def test_the_noise_on_the_scores_varies_the_principal_sentences_of_close_calls():
    ids, block = special_ids_stub(), [[10, 11], [10, 12], [11, 12], [13, 14]]  # the first three score alike
    chosen = {tuple(check_gap_sentence_pair(block, *gap_sentences(block, ids, np.random.default_rng(seed)), ids))
              for seed in range(50)}
    assert len(chosen) > 2 and all(3 not in c for c in chosen)  # the unrelated sentence never wins


def test_sentence_blocks_are_runs_of_whole_sentences_within_the_size():
    sentences = [[1] * 3, [2] * 4, [3] * 2, [4] * 9, [], [5] * 1]
    assert list(sentence_blocks(sentences, 7)) == [[[1] * 3, [2] * 4], [[3] * 2], [[4] * 7], [[5]]]


@pytest.mark.parametrize("objective", ["bart", "span_corruption", "gap_sentences"])
def test_a_shards_pairs_are_blocks_of_one_book_seeded_by_the_rng(tmp_path, objective):
    texts = [" ".join(p.split()) for p in (write_books(tmp_path / "books", n_books=2) / "book_00.txt").read_text()
             .split(".") if p.strip()]
    book_ids = ["a"] * (len(texts) // 2) + ["b"] * (len(texts) - len(texts) // 2)
    tokenizer = train_byte_level_bpe(texts, tmp_path / "tok", 400, 1, special_tokens(8))
    assert [tokenizer.token_to_id(t) for t in (EOS, MASK, sentinel(0))] == [2, 3, 4]
    pairs = shard_examples(book_ids, texts, tokenizer, 40, objective, np.random.default_rng(0))
    assert pairs == shard_examples(book_ids, texts, tokenizer, 40, objective, np.random.default_rng(0))
    assert len(pairs) > 5 and all(len(s) <= 41 and len(t) <= 40 for s, t in pairs)
    assert all(s[-1] == t[-1] == 2 for s, t in pairs)
    ids = special_ids(tokenizer)
    if objective == "bart":
        originals = "".join(tokenizer.decode(t) for _, t in pairs)
        assert originals.replace(" ", "") == "".join(texts).replace(" ", "")  # every sentence once, in order
        assert all(ids.mask in s for s, t in pairs if len(t) > 4)
    elif objective == "gap_sentences":
        for source, target in pairs:  # whole sentences masked, one mask each, and generated in the target
            assert source.count(ids.mask) >= 1 and ids.mask not in target and len(target) > 1
            assert len(source) - source.count(ids.mask) + len(target) - 2 <= 39  # the block within block_size - 1
        # each pair's kept and generated text together is its block: no sentence twice (one-sentence blocks skipped)
        text = Counter("".join(tokenizer.decode(s) + tokenizer.decode(t) for s, t in pairs).replace(" ", ""))
        assert not text - Counter("".join(texts).replace(" ", ""))
        assert shard_examples(["c"], texts[:1], tokenizer, 40, objective, np.random.default_rng(0)) == []
    else:
        assert all(s.count(ids.sentinels[0]) == 1 and t[0] == ids.sentinels[0] for s, t in pairs)
