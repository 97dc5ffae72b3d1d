import random

import numpy as np
import pyarrow as pa
import pytest
import torch

from data_prep.corpus.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID, encode_batch_ids, train_wordpiece
from data_prep.examples.bert_examples import (
    INSTANCE_SCHEMA,
    TrainingInstance,
    continuation_mask_from_vocab,
    create_instances_from_document,
    create_masked_lm_predictions,
    create_training_instances,
    read_instances,
    to_features,
    truncate_seq_pair,
    write_instances,
)
from models import IGNORE_INDEX
from pipeline.bert.data import BertPretrainingCollator

SPECIAL_IDS = (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID)
VOCAB_SIZE = 1000
FIRST_TOKEN_ID = 10


def _documents(num_documents, sentences_per_document, seed=0, min_len=4, max_len=12):
    """Documents whose token ids are all distinct, so every token tells where it came from."""
    rng = random.Random(seed)
    next_id = FIRST_TOKEN_ID
    documents = []
    for _ in range(num_documents):
        document = []
        for _ in range(sentences_per_document):
            length = rng.randint(min_len, max_len)
            document.append(list(range(next_id, next_id + length)))
            next_id += length
        documents.append(document)
    return documents


def _origin(documents):
    """token id -> (document index, position in the document's token stream)."""
    return {
        token: (d, position)
        for d, document in enumerate(documents)
        for position, token in enumerate(t for sentence in document for t in sentence)
    }


def _span(tokens, origin):
    """(document, first position, last position) of a contiguous run of one document's tokens."""
    docs = {origin[t][0] for t in tokens}
    positions = [origin[t][1] for t in tokens]
    assert len(docs) == 1, "segment mixes documents"
    assert positions == list(range(positions[0], positions[0] + len(positions))), "segment is not contiguous"
    return docs.pop(), positions[0], positions[-1]


# ---------------------------------------------------------------------------------------------------- instances


def test_to_features():
    input_ids, token_type_ids = to_features(TrainingInstance([7, 8], [9], True), CLS_ID, SEP_ID)
    assert input_ids == [CLS_ID, 7, 8, SEP_ID, 9, SEP_ID]
    assert token_type_ids == [0, 0, 0, 0, 1, 1]


def test_truncate_seq_pair_trims_longer_side_from_both_ends():
    removed_front = removed_back = False
    for seed in range(50):
        a, b = list(range(10)), [100, 101]
        truncate_seq_pair(a, b, 8, random.Random(seed))
        assert len(a) + len(b) == 8 and b == [100, 101]
        assert a == list(range(a[0], a[0] + 6))  # a contiguous piece: tokens only leave from the ends
        removed_front |= a[0] > 0
        removed_back |= a[-1] < 9
    assert removed_front and removed_back
    a, b = [1, 2, 3], [4, 5, 6, 7, 8]
    truncate_seq_pair(a, b, 4, random.Random(0))
    assert len(a) == 2 and len(b) == 2  # the longer side is cut until the two are level
    a, b = [1, 2], [3]
    truncate_seq_pair(a, b, 5, random.Random(0))
    assert (a, b) == ([1, 2], [3])


@pytest.fixture(scope="module")
def corpus():
    documents = _documents(num_documents=200, sentences_per_document=40)
    instances = create_training_instances(documents, 64, 0.1, 2, random.Random(1))
    return documents, instances


def test_instances_fit_max_seq_length(corpus):
    _, instances = corpus
    assert len(instances) > 1000
    for instance in instances:
        assert instance.tokens_a and instance.tokens_b
        input_ids, token_type_ids = to_features(instance, CLS_ID, SEP_ID)
        assert len(input_ids) == len(token_type_ids) <= 64
        assert input_ids.count(SEP_ID) == 2 and input_ids[0] == CLS_ID


def test_random_next_rate_is_about_half(corpus):
    _, instances = corpus
    rate = np.mean([instance.is_random_next for instance in instances])
    # 0.5 per multi-sentence chunk; single-sentence chunks (rare with 4-12 token sentences and 61-token
    # targets) always take a random B. Standard error here is ~0.01.
    assert 0.47 < rate < 0.58


def test_actual_next_is_contiguous_and_random_next_from_other_document(corpus):
    documents, instances = corpus
    origin = _origin(documents)
    for instance in instances:
        doc_a, _, a_last = _span(instance.tokens_a, origin)
        doc_b, b_first, _ = _span(instance.tokens_b, origin)
        if instance.is_random_next:
            assert doc_b != doc_a
        else:
            assert doc_b == doc_a and b_first > a_last
            if len(instance.tokens_a) + len(instance.tokens_b) < 61:  # not truncated: B starts right after A
                assert b_first == a_last + 1


def test_deterministic_per_seed():
    documents = _documents(20, 30)
    first = create_training_instances(documents, 64, 0.1, 2, random.Random(5))
    again = create_training_instances(documents, 64, 0.1, 2, random.Random(5))
    other = create_training_instances(documents, 64, 0.1, 2, random.Random(6))
    assert first == again
    assert first != other


def test_short_seq_prob_is_honoured():
    documents = _documents(20, 400)

    def short_fraction(short_seq_prob):
        instances = create_training_instances(documents, 128, short_seq_prob, 1, random.Random(0))
        lengths = np.array([len(i.tokens_a) + len(i.tokens_b) for i in instances])
        return np.mean(lengths < 40)

    # Without short sequences only document tails fall short. With short_seq_prob=1 every instance draws its
    # target uniformly in [2, 125], and about a quarter of the targets are under 35. The target is drawn per
    # instance, not per document, so the fraction is stable even with few long documents.
    assert short_fraction(0.0) < 0.03
    assert short_fraction(1.0) > 0.2
    assert 0.06 < short_fraction(0.5) < 0.2


def test_unused_segments_are_put_back():
    # Every chunk has 2+ sentences, so B is random exactly when the rewind happens; A's sentences must then be
    # followed in the next instance by the sentences right after A, not skipped.
    documents = _documents(2, 200, seed=3)
    instances = create_instances_from_document(documents, 0, 64, 0.0, random.Random(0))
    origin = _origin(documents)
    stream_end = -1
    for instance in instances:
        _, a_first, a_last = _span(instance.tokens_a, origin)
        assert a_first > stream_end
        stream_end = a_last if instance.is_random_next else _span(instance.tokens_b, origin)[2]
    covered = sum(len(i.tokens_a) + (0 if i.is_random_next else len(i.tokens_b)) for i in instances)
    total = sum(len(s) for s in documents[0])
    assert covered > 0.9 * total  # only truncation drops tokens


def test_single_document_and_empty_inputs():
    with pytest.raises(ValueError, match="at least 2 documents"):
        create_training_instances([[[10, 11], [12, 13]]], 16, 0.1, 1, random.Random(0))
    # Empty documents and empty sentences are dropped before instances are made.
    documents = [[[10, 11], [], [12, 13]], [], [[20, 21, 22]]]
    instances = create_training_instances(documents, 16, 0.0, 3, random.Random(0))
    assert instances and all(i.tokens_a and i.tokens_b for i in instances)
    with pytest.raises(ValueError, match="max_seq_length"):
        create_training_instances(_documents(3, 3), 4, 0.0, 1, random.Random(0))


# ------------------------------------------------------------------------------------------------ static masking


def _sequences(num, seed=0):
    rng = random.Random(seed)
    sequences = []
    for _ in range(num):
        a = [rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(rng.randint(20, 70))]
        b = [rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(rng.randint(20, 55))]
        sequences.append(to_features(TrainingInstance(a, b, False), CLS_ID, SEP_ID)[0])
    return sequences


def _check_80_10_10(originals, masked, num_selected):
    # Over ~30k selections the standard error of each fraction is < 0.003.
    assert abs(np.sum(masked == MASK_ID) / num_selected - 0.8) < 0.015
    assert abs(np.sum(masked == originals) / num_selected - 0.1) < 0.01  # kept (random hits ~0.1 % more)
    replaced = (masked != MASK_ID) & (masked != originals)
    assert abs(np.sum(replaced) / num_selected - 0.1) < 0.01
    assert not np.isin(masked[replaced], SPECIAL_IDS).any()


def test_static_masking_rate_and_80_10_10():
    rng = random.Random(0)
    originals, masked = [], []
    for input_ids in _sequences(2000):
        output, positions, labels = create_masked_lm_predictions(
            input_ids, SPECIAL_IDS, 0.15, 1000, VOCAB_SIZE, MASK_ID, rng
        )
        eligible = len(input_ids) - 3
        assert len(positions) == round(0.15 * eligible)
        assert positions == sorted(set(positions))
        assert labels == [input_ids[p] for p in positions]
        assert all(input_ids[p] not in SPECIAL_IDS for p in positions)
        unmasked = set(range(len(input_ids))) - set(positions)
        assert all(output[i] == input_ids[i] for i in unmasked)
        originals.extend(labels)
        masked.extend(output[p] for p in positions)
    _check_80_10_10(np.array(originals), np.array(masked), len(originals))


def test_static_masking_caps_predictions_and_masks_at_least_one():
    rng = random.Random(0)
    for input_ids in _sequences(50):
        _, positions, _ = create_masked_lm_predictions(input_ids, SPECIAL_IDS, 0.5, 7, VOCAB_SIZE, MASK_ID, rng)
        assert len(positions) == 7
    short = [CLS_ID, 50, SEP_ID, 60, SEP_ID]
    _, positions, _ = create_masked_lm_predictions(short, SPECIAL_IDS, 0.15, 20, VOCAB_SIZE, MASK_ID, rng)
    assert len(positions) == 1 and positions[0] in (1, 3)
    only_special = [CLS_ID, SEP_ID, SEP_ID]
    assert create_masked_lm_predictions(only_special, SPECIAL_IDS, 0.15, 20, VOCAB_SIZE, MASK_ID, rng) == (
        only_special,
        [],
        [],
    )


def test_whole_word_masking_masks_all_pieces_together():
    # Ids >= 500 are "##" continuation pieces.
    subword_flags = np.arange(VOCAB_SIZE) >= 500
    rng = random.Random(0)
    with pytest.raises(ValueError, match="continuation_mask_from_vocab"):
        create_masked_lm_predictions([CLS_ID, 20, SEP_ID], SPECIAL_IDS, 0.15, 20, VOCAB_SIZE, MASK_ID, rng,
                                     whole_word_mask=True)
    for _ in range(300):
        words = [[rng.randrange(10, 500)] + [rng.randrange(500, VOCAB_SIZE) for _ in range(rng.randint(0, 3))]
                 for _ in range(rng.randint(10, 40))]
        input_ids = [CLS_ID] + [t for word in words for t in word] + [SEP_ID]
        _, positions, _ = create_masked_lm_predictions(
            input_ids, SPECIAL_IDS, 0.15, 20, VOCAB_SIZE, MASK_ID, rng,
            whole_word_mask=True, subword_flags=subword_flags,
        )
        assert 0 < len(positions) <= 20
        start = 1
        chosen = set(positions)
        for word in words:
            pieces = set(range(start, start + len(word)))
            assert pieces <= chosen or not pieces & chosen, "word masked in part"
            start += len(word)


def test_continuation_mask_from_vocab(tmp_path):
    sentences = ["unbelievable believers believe", "running runners run"] * 50
    tokenizer = train_wordpiece(sentences, tmp_path, vocab_size=60)
    flags = continuation_mask_from_vocab(tokenizer)
    assert flags.dtype == bool and flags.shape == (tokenizer.get_vocab_size(),)
    vocab = tokenizer.get_vocab()
    assert flags.any()
    assert all(flags[i] == token.startswith("##") for token, i in vocab.items())


# ---------------------------------------------------------------------------------------------- dynamic masking


def _collator(seed=None, **kwargs):
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return BertPretrainingCollator(PAD_ID, MASK_ID, VOCAB_SIZE, SPECIAL_IDS, generator=generator, **kwargs)


def _rows(sequences):
    return [
        {"input_ids": ids, "token_type_ids": [0] * (ids.index(SEP_ID) + 1) + [1] * (len(ids) - ids.index(SEP_ID) - 1),
         "next_sentence_label": b % 2}
        for b, ids in enumerate(sequences)
    ]


def test_collator_shapes_and_labels():
    sequences = _sequences(16)
    batch = _collator(seed=0)(_rows(sequences))
    lengths = [len(s) for s in sequences]
    B, T = 16, max(lengths)
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (B, T)
    num_predictions = [min(20, max(1, round(0.15 * (n - 3)))) for n in lengths]
    assert batch["mlm_positions"].shape == batch["mlm_labels"].shape == (B, max(num_predictions))
    assert batch["next_sentence_label"].tolist() == [b % 2 for b in range(B)]
    assert all(t.dtype == torch.long for t in batch.values())
    for b, ids in enumerate(sequences):
        n = len(ids)
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (T - n)
        assert batch["token_type_ids"][b, :n].tolist() == _rows([ids])[0]["token_type_ids"]
        assert (batch["input_ids"][b, n:] == PAD_ID).all() and (batch["token_type_ids"][b, n:] == 0).all()
        k = num_predictions[b]
        positions = batch["mlm_positions"][b].tolist()
        labels = batch["mlm_labels"][b].tolist()
        assert positions[:k] == sorted(set(positions[:k]))
        assert labels[:k] == [ids[p] for p in positions[:k]]
        assert positions[k:] == [0] * (len(positions) - k) and labels[k:] == [IGNORE_INDEX] * (len(labels) - k)
        assert all(ids[p] not in SPECIAL_IDS for p in positions[:k])
        unmasked = sorted(set(range(n)) - set(positions[:k]))
        assert batch["input_ids"][b, unmasked].tolist() == [ids[i] for i in unmasked]


def test_collator_rate_and_80_10_10_over_large_batch():
    sequences = _sequences(2000, seed=1)
    batch = _collator(seed=0, max_predictions_per_seq=1000)(_rows(sequences))
    is_prediction = batch["mlm_labels"] != IGNORE_INDEX
    assert is_prediction.sum(dim=1).tolist() == [round(0.15 * (len(s) - 3)) for s in sequences]
    masked = batch["input_ids"].gather(1, batch["mlm_positions"])[is_prediction].numpy()
    originals = batch["mlm_labels"][is_prediction].numpy()
    _check_80_10_10(originals, masked, len(originals))


def test_collator_never_masks_special_or_padding_and_caps():
    sequences = _sequences(64, seed=2)
    collator = _collator(mlm_probability=0.9, max_predictions_per_seq=5)
    batch = collator(_rows(sequences))
    assert batch["mlm_positions"].shape == (64, 5) and (batch["mlm_labels"] != IGNORE_INDEX).all()
    for b, ids in enumerate(sequences):
        assert all(ids[p] not in SPECIAL_IDS for p in batch["mlm_positions"][b].tolist())
        specials = [i for i, t in enumerate(ids) if t in SPECIAL_IDS]
        assert batch["input_ids"][b, specials].tolist() == [ids[i] for i in specials]
        assert (batch["input_ids"][b, len(ids):] == PAD_ID).all()
    # A sequence with one maskable token still gets a prediction; one with none gets only padding slots.
    batch = collator(_rows([[CLS_ID, 42, SEP_ID, SEP_ID], [CLS_ID, SEP_ID, SEP_ID]]))
    assert batch["mlm_positions"].tolist() == [[1], [0]] and batch["mlm_labels"].tolist() == [[42], [IGNORE_INDEX]]


def test_collator_generator_is_deterministic_and_masks_change():
    rows = _rows(_sequences(8, seed=3))

    first, again, other = _collator(seed=0)(rows), _collator(seed=0)(rows), _collator(seed=1)(rows)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["mlm_positions"], other["mlm_positions"])
    # Dynamic masking: the same collator draws new masks each time it sees the batch.
    collator = _collator(seed=0)
    assert not torch.equal(collator(rows)["mlm_positions"], collator(rows)["mlm_positions"])


# ---------------------------------------------------------------------------------------------------- Arrow I/O


def test_write_read_round_trip(tmp_path):
    instances = create_training_instances(_documents(10, 20), 48, 0.1, 1, random.Random(0))
    path = tmp_path / "shard-00000.arrow"
    write_instances(instances, path, CLS_ID, SEP_ID)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]

    allocated = pa.total_allocated_bytes()
    table = read_instances(path)
    # Memory-mapped and uncompressed: the columns point into the mapped file, nothing is copied onto the heap.
    assert pa.total_allocated_bytes() == allocated
    assert table.schema == INSTANCE_SCHEMA
    assert table.num_rows == len(instances)
    rows = table.to_pylist()
    for row, instance in zip(rows, instances):
        input_ids, token_type_ids = to_features(instance, CLS_ID, SEP_ID)
        assert row == {"input_ids": input_ids, "token_type_ids": token_type_ids,
                       "next_sentence_label": int(instance.is_random_next)}
    batch = _collator()(rows[:4])
    assert batch["input_ids"].shape[0] == 4


def test_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "shard.arrow"

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pa.ipc, "new_file", fail)
    with pytest.raises(OSError, match="disk full"):
        write_instances([TrainingInstance([11], [12], False)], path, CLS_ID, SEP_ID)
    assert list(tmp_path.iterdir()) == []


def test_end_to_end_with_trained_tokenizer(tmp_path):
    rng = random.Random(0)
    words = ["the", "old", "river", "ran", "past", "houses", "quietly", "and", "a", "runner", "jumped"]
    books = [[" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + " ." for _ in range(30)]
             for _ in range(6)]
    tokenizer = train_wordpiece((s for book in books for s in book), tmp_path / "tok", vocab_size=100)
    documents = [encode_batch_ids(tokenizer, book) for book in books]
    instances = create_training_instances(documents, 32, 0.1, 2, random.Random(0))
    write_instances(instances, tmp_path / "shard.arrow", CLS_ID, SEP_ID)
    rows = read_instances(tmp_path / "shard.arrow").slice(0, 8).to_pylist()
    collator = BertPretrainingCollator(PAD_ID, MASK_ID, tokenizer.get_vocab_size(), SPECIAL_IDS)
    batch = collator(rows)
    assert batch["input_ids"].shape[1] <= 32
    assert (batch["input_ids"] < tokenizer.get_vocab_size()).all()


def test_whole_word_masking_chooses_every_piece_of_a_word_or_none_within_the_count():
    continuation = np.zeros(VOCAB_SIZE, dtype=bool)
    continuation[FIRST_TOKEN_ID::3] = True  # a third of the ids are "##" pieces
    sequences = _sequences(64)
    collator = _collator(seed=0, masking="whole_word", continuation=continuation)
    batch = collator(_rows(sequences))
    again = _collator(seed=0, masking="whole_word", continuation=continuation)(_rows(sequences))
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # reproducible from its generator
    chosen_counts = []
    for b, ids in enumerate(sequences):
        positions = {int(p) for p, label in zip(batch["mlm_positions"][b], batch["mlm_labels"][b])
                     if label != IGNORE_INDEX}
        words, current = [], []  # the words of the row: a non-continuation piece and the "##" pieces after it
        for i, token in enumerate(ids):
            if token in SPECIAL_IDS:
                current = []
                continue
            if not continuation[token] or not current:
                current = [i]
                words.append(current)
            else:
                current.append(i)
        for word in words:
            assert {i in positions for i in word} in ({True}, {False}), (b, word, positions)
        budget = min(20, max(1, round(0.15 * (len(ids) - 3))))
        assert len(positions) <= budget
        chosen_counts.append(len(positions) / budget)
        assert all(batch["mlm_labels"][b, k] == ids[p]
                   for k, p in enumerate(batch["mlm_positions"][b].tolist()) if p in positions)
    # words are taken until the next one would overshoot: most of the count is used
    assert np.mean(chosen_counts) > 0.8
    # and the words chosen vary: not always the first ones
    first = [int(batch["mlm_positions"][b, 0]) for b in range(len(sequences))]
    assert len(set(first)) > 10


def _continuation_every_third_id():
    continuation = np.zeros(VOCAB_SIZE, dtype=bool)
    continuation[FIRST_TOKEN_ID::3] = True  # a third of the ids are "##" pieces: words of 1.5 pieces on average
    return continuation


def _spans(collator, sequences, num_to_predict):
    """The spans _choose_spans picks in `sequences` (rows of equal length), as (row, positions, words) each."""
    input_ids = torch.tensor(sequences)
    maskable = ~torch.isin(input_ids, collator.special_ids)
    chosen, decided_at = collator._choose_spans(input_ids, maskable, torch.full((len(sequences),), num_to_predict))
    starts = collator._word_starts(input_ids, maskable)
    return [(b, positions, int(starts[b, positions].sum()))
            for b in range(len(sequences))
            for first in decided_at[b][chosen[b]].unique().tolist()
            for positions in [torch.nonzero(chosen[b] & (decided_at[b] == first)).squeeze(1)]]


def test_span_masking_chooses_runs_of_whole_words_up_to_the_count():
    continuation = _continuation_every_third_id()
    sequences = _sequences(64)
    rows = _rows(sequences)
    batch = _collator(seed=0, masking="span", continuation=continuation)(rows)
    again = _collator(seed=0, masking="span", continuation=continuation)(rows)
    other = _collator(seed=1, masking="span", continuation=continuation)(rows)
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # reproducible from its generator
    assert not torch.equal(batch["mlm_positions"], other["mlm_positions"])
    for b, ids in enumerate(sequences):
        positions = batch["mlm_positions"][b][batch["mlm_labels"][b] != IGNORE_INDEX].tolist()
        budget = min(20, max(1, round(0.15 * (len(ids) - 3))))
        assert len(positions) == budget, (b, positions)  # spans are drawn until the count is met
        assert not {ids[p] for p in positions} & set(SPECIAL_IDS)
    capped = _collator(seed=0, masking="span", continuation=continuation, mlm_probability=0.9,
                       max_predictions_per_seq=5)(rows)
    assert ((capped["mlm_labels"] != IGNORE_INDEX).sum(dim=1) <= 5).all()

    collator = _collator(seed=0, masking="span", continuation=continuation)
    equal_length = [ids[:60] for ids in sequences if len(ids) >= 60]
    for b, positions, words in _spans(collator, equal_length, 9):
        ids = equal_length[b]
        first, last = int(positions[0]), int(positions[-1])
        assert positions.tolist() == list(range(first, last + 1))  # contiguous, within one segment
        assert not continuation[ids[first]] or ids[first - 1] in SPECIAL_IDS  # starts at a word's first piece
        assert last + 1 == len(ids) or ids[last + 1] in SPECIAL_IDS or not continuation[ids[last + 1]]  # ends one
        assert 1 <= words <= 10


def test_span_lengths_follow_spanberts_geometric_distribution():
    """Joshi et al. 2020, §3.1: geometric with p = 0.2, truncated at 10 words, mean 3.8. Long rows with few masked
    pieces, so that few spans are cut short by the count, by a chosen word or by the segment's end (those bring the
    mean down ~0.15); a clipped distribution would give 4.5, p = 0.3 gives 2.9."""
    continuation = _continuation_every_third_id()
    rng = random.Random(0)
    sequences = [[CLS_ID, *(rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(20000)), SEP_ID]
                 for _ in range(8)]
    collator = _collator(seed=0, masking="span", continuation=continuation, max_predictions_per_seq=1000)
    lengths = np.array([words for _, _, words in _spans(collator, sequences, 600)])
    assert len(lengths) > 800
    assert abs(lengths.mean() - 3.8) < 0.3, lengths.mean()
    assert lengths.max() == 10
    assert abs(np.mean(lengths == 1) - 0.2 / (1 - 0.8 ** 10)) < 0.05


def test_span_masking_decides_80_10_10_once_per_span():
    continuation = _continuation_every_third_id()
    sequences = _sequences(256)
    rows = _rows(sequences)
    batch = _collator(seed=0, masking="span", continuation=continuation, mlm_probability=0.05)(rows)
    masked = batch["input_ids"] == MASK_ID
    selected = torch.zeros_like(masked).scatter_(1, batch["mlm_positions"], batch["mlm_labels"] != IGNORE_INDEX)
    assert abs(float(masked.sum() / selected.sum()) - 0.8) < 0.05
    # at 5 % few spans touch: a run of chosen pieces is then one span, all [MASK] or none (per piece, 3 pieces would
    # mix in half the runs)
    runs = [masked[b, start:end] for b in range(len(rows))
            for start, end in _runs(selected[b].tolist()) if end - start >= 3]
    mixed = sum(bool(run.any() and not run.all()) for run in runs)
    assert len(runs) > 100 and mixed / len(runs) < 0.1


def _runs(flags):
    """[start, end) of each run of True."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("masking", ["whole_word", "span"])
def test_word_masking_without_the_continuation_pieces_says_how_to_compute_them(masking):
    with pytest.raises(ValueError, match="continuation_mask_from_vocab"):
        _collator(masking=masking)


def test_doc_sentences_pack_contiguous_sentences_of_one_document_into_one_segment():
    documents = [[[100 + 10 * d + s] * 7 for s in range(9)] for d in range(3)]  # sentence s of document d: 7 tokens
    instances = create_training_instances(documents, max_seq_length=24, short_seq_prob=0.0, dupe_factor=1,
                                          rng=random.Random(0), packing="doc_sentences")
    assert all(not i.tokens_b and not i.is_random_next for i in instances)
    by_document = {}
    for instance in instances:
        sentences = sorted(set(instance.tokens_a))
        assert len({t // 10 - 10 for t in sentences}) == 1  # never across documents
        assert sentences == list(range(sentences[0], sentences[-1] + 1))  # contiguous sentences
        assert len(instance.tokens_a) <= 22
        by_document.setdefault(sentences[0] // 10 - 10, []).extend(instance.tokens_a)
    # every sentence is read (the last of a full chunk is cut at the length): sentences 0..8 of each document
    assert all(sorted(set(tokens)) == [100 + 10 * d + s for s in range(9)] for d, tokens in by_document.items())
    input_ids, token_types = to_features(instances[0], CLS_ID, SEP_ID)
    assert input_ids == [CLS_ID, *instances[0].tokens_a, SEP_ID] and set(token_types) == {0}


def test_doc_sentences_without_a_second_segment_refuse_next_sentence_prediction(tmp_path):
    from pipeline.runner import validate
    from tests.helpers import tiny_config

    with pytest.raises(ValueError, match="next_sentence_prediction=false"):
        validate(tiny_config(tmp_path, ["examples.packing=doc_sentences"]))
    validate(tiny_config(tmp_path, ["examples.packing=doc_sentences", "pretrain.next_sentence_prediction=false"]))
