"""BERT pretraining examples: sentence-pair instances for next-sentence prediction (NSP) and masked-LM masking.

A port of google-research/bert's ``create_pretraining_data.py`` to token ids. Instances are built from
*documents* (here one book: the token ids of its sentences, in order) exactly as the original builds them;
the pipeline's Ray layer maps these pure functions over shards, each call with its own seeded ``rng``.

Masking comes in two forms:

* static (:func:`create_masked_lm_predictions`), as in the original BERT, where masks are drawn once while the
  data is written and repeated ``dupe_factor`` times with different masks;
* dynamic (the default: `BertPretrainingCollator` in pipeline/bert/data.py, with the same fractions), as in RoBERTa
  (Liu et al., 2019, section 4.1), where masks are re-drawn every time a batch is assembled, so each epoch sees new
  masks without duplicating data. It is a torch collator, kept out of this module so that the Ray workers building
  instances never load torch.

Paper references are to Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding".
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from data_prep.corpus.shards import atomic_arrow_file

# [CLS] A [SEP] B [SEP]
NUM_SPECIAL_TOKENS_IN_PAIR = 3
# Masked-LM fractions of the selected tokens (paper, section 3.1 and appendix C.2): replacing only with [MASK]
# would create a mismatch with fine-tuning, where [MASK] never appears; random tokens and unchanged tokens make
# the model keep a contextual representation of every input token.
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1

INSTANCE_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("token_type_ids", pa.list_(pa.int8()), nullable=False),
        # 1 = segment B is a random sentence ("NotNext"), 0 = B follows A ("IsNext"); the label convention of
        # google-research/bert's run_pretraining.py (next_sentence_labels = 1 if is_random_next else 0).
        pa.field("next_sentence_label", pa.int8(), nullable=False),
    ]
)


@dataclass
class TrainingInstance:
    """A sentence pair for NSP, as token ids without special tokens."""

    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool


def to_features(instance: TrainingInstance, cls_id: int, sep_id: int) -> tuple[list[int], list[int]]:
    """``input_ids`` = [CLS] A [SEP] B [SEP] and ``token_type_ids`` = 0 over [CLS] A [SEP], 1 over B [SEP]; an
    instance without B (DOC-SENTENCES packing) is [CLS] A [SEP], all segment 0."""
    if not instance.tokens_b:
        return [cls_id, *instance.tokens_a, sep_id], [0] * (len(instance.tokens_a) + 2)
    input_ids = [cls_id, *instance.tokens_a, sep_id, *instance.tokens_b, sep_id]
    len_a = len(instance.tokens_a) + 2
    token_type_ids = [0] * len_a + [1] * (len(input_ids) - len_a)
    return input_ids, token_type_ids


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Truncate the pair in place to ``max_num_tokens`` in total, one token at a time from the longer segment.

    The token is removed from the front or the back at random, as google-research/bert does "to add more
    randomness and avoid biases" (always cutting the back would, e.g., never show the model a cut-off start).
    """
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _random_other_document(num_documents: int, document_index: int, rng: random.Random) -> int:
    # The original retries a uniform draw 10 times and may still end on the same document; drawing uniformly
    # among the *other* documents is what it intends, in a single draw.
    index = rng.randrange(num_documents - 1)
    return index + 1 if index >= document_index else index


def _target_seq_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    # Pretraining mostly uses full-length sequences, since padding is wasted computation, but short ones now and
    # then reduce the mismatch with fine-tuning on short inputs (the original's short_seq_prob, 0.1 by default).
    # The target is soft: a chunk stops at the first sentence boundary past it; only max_num_tokens is enforced.
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_num_tokens)
    return max_num_tokens


def create_instances_from_document(
    all_documents: Sequence[Sequence[Sequence[int]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[TrainingInstance]:
    """NSP instances from ``all_documents[document_index]`` (a list of sentences, each a non-empty id list).

    Faithful to google-research/bert: sentences are accumulated into a chunk until it reaches the target
    length; a random prefix of the chunk's sentences becomes segment A. With probability 0.5 (or always when the
    chunk holds a single sentence) segment B is taken from a random *other* document and the chunk's unused
    sentences are put back to start the next chunk; otherwise B is the rest of the chunk (the actual next
    sentences). Every document other than ``document_index`` must be non-empty, and there must be at least two
    documents; :func:`create_training_instances` ensures both.

    One deliberate difference: the original draws the target length once per document, which on Wikipedia
    articles (a few sequences each) is close to once per sequence; a book yields hundreds of sequences, so here
    it is drawn again for every instance, keeping short_seq_prob the fraction of short *sequences* instead of
    making whole books short.
    """
    if len(all_documents) < 2:
        raise ValueError(
            "next-sentence prediction needs at least 2 documents to draw random segments B from; "
            f"got {len(all_documents)} -- the corpus needs at least 2 books"
        )
    max_num_tokens = max_seq_length - NUM_SPECIAL_TOKENS_IN_PAIR
    if max_num_tokens < 2:
        raise ValueError(f"max_seq_length must be at least {NUM_SPECIAL_TOKENS_IN_PAIR + 2}, got {max_seq_length}")
    document = all_documents[document_index]
    target_seq_length = _target_seq_length(max_num_tokens, short_seq_prob, rng)

    # A and B are split at sentence boundaries, not at an arbitrary token of the concatenated document: as
    # google-research/bert notes, an arbitrary split point would make next-sentence prediction too easy.
    instances = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            # Number of chunk sentences that go into A.
            a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
            tokens_a = [token for sentence in current_chunk[:a_end] for token in sentence]

            tokens_b: list[int] = []
            if len(current_chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                random_document = all_documents[_random_other_document(len(all_documents), document_index, rng)]
                random_start = rng.randint(0, len(random_document) - 1)
                for sentence in random_document[random_start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b_length:
                        break
                # The chunk's sentences after A were not used; rewind so they start the next chunk rather than
                # being wasted.
                i -= len(current_chunk) - a_end
            else:
                is_random_next = False
                tokens_b = [token for sentence in current_chunk[a_end:] for token in sentence]

            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(TrainingInstance(tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
            target_seq_length = _target_seq_length(max_num_tokens, short_seq_prob, rng)
        i += 1
    return instances


def create_doc_sentence_instances(document: Sequence[Sequence[int]], max_seq_length: int, short_seq_prob: float,
                                  rng: random.Random) -> list[TrainingInstance]:
    """RoBERTa's DOC-SENTENCES (Liu et al. 2019, §4.2): contiguous sentences of one document packed up to the target
    length, never across documents and without a second segment; a sentence longer than the sequence is cut at its
    end. Without next-sentence prediction, pairs only halve the context a masked token is predicted from, and a
    random B puts unrelated text beside it half the time; RoBERTa measured DOC-SENTENCES best of their four inputs."""
    max_num_tokens = max_seq_length - 2  # [CLS] A [SEP]
    if max_num_tokens < 1:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    instances, chunk = [], []
    target = _target_seq_length(max_num_tokens, short_seq_prob, rng)
    for i, sentence in enumerate(document):
        chunk.extend(sentence)
        if len(chunk) >= target or i == len(document) - 1:
            instances.append(TrainingInstance(chunk[:max_num_tokens], [], False))
            chunk, target = [], _target_seq_length(max_num_tokens, short_seq_prob, rng)
    return instances


# examples.packing: what one instance holds
PACKINGS = ("sentence_pairs", "doc_sentences")


def create_training_instances(
    all_documents: Sequence[Sequence[Sequence[int]]],
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    rng: random.Random,
    random_next_documents: Sequence[Sequence[Sequence[int]]] = (),
    packing: str = "sentence_pairs",
) -> list[TrainingInstance]:
    """All NSP instances of ``all_documents``, ``dupe_factor`` passes over each document, shuffled with ``rng``.

    Empty sentences and empty documents are dropped first, as the original does. Each pass draws new target
    lengths, split points and random segments, so with static masking the passes also differ in their masks.
    (The original also shuffles the documents beforehand; that changes nothing in distribution, since random
    documents are drawn uniformly and the instances are shuffled at the end, so it is left out.)
    ``random_next_documents`` only serve as sources of random segments B, never as segment A: a shard that holds
    a single long book borrows them from a neighbouring shard. ``packing="doc_sentences"`` builds single-segment
    instances instead (:func:`create_doc_sentence_instances`).
    """
    if packing not in PACKINGS:
        raise ValueError(f"examples.packing={packing!r}; use one of {list(PACKINGS)}")
    def non_empty(docs):
        return [doc for doc in ([s for s in document if len(s)] for document in docs) if doc]

    documents = non_empty(all_documents)
    sources = documents + non_empty(random_next_documents)
    instances = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_doc_sentence_instances(documents[document_index], max_seq_length, short_seq_prob, rng)
                if packing == "doc_sentences" else
                create_instances_from_document(sources, document_index, max_seq_length, short_seq_prob, rng)
            )
    rng.shuffle(instances)
    return instances


def continuation_mask_from_vocab(tokenizer: Tokenizer) -> np.ndarray:
    """Boolean array indexed by token id: True where the piece continues a word ("##ing").

    Computed once per vocabulary; whole-word masking uses it to group a word's pieces.
    """
    prefix = tokenizer.model.continuing_subword_prefix
    mask = np.zeros(tokenizer.get_vocab_size(), dtype=bool)
    for token, token_id in tokenizer.get_vocab().items():
        mask[token_id] = token.startswith(prefix)
    return mask


def create_masked_lm_predictions(
    input_ids: Sequence[int],
    special_ids: Collection[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_size: int,
    mask_id: int,
    rng: random.Random,
    *,
    whole_word_mask: bool = False,
    subword_flags: Sequence[bool] | np.ndarray | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Static masked-LM masking of one sequence: returns (masked input_ids, positions, label ids).

    As google-research/bert: ``round(masked_lm_prob * n)`` tokens (at least 1, at most
    ``max_predictions_per_seq``) are chosen among the ``n`` tokens whose id is not in ``special_ids``; each is
    replaced by ``mask_id`` with probability 0.8, by a random non-special id with probability 0.1, and kept
    with probability 0.1. Positions are returned in increasing order, labels are the original ids there.

    With ``whole_word_mask``, a word's WordPiece pieces are chosen (or skipped) together, so the model cannot
    recover a masked piece from the rest of its word; ``subword_flags[id]`` must tell whether piece ``id`` is a
    continuation (see :func:`continuation_mask_from_vocab`). Each piece still gets its own 80/10/10 draw, as in
    the original.

    Two deliberate differences from the original: the 15 % is of the maskable tokens (the original counts
    [CLS]/[SEP] in the sequence length), and random replacements exclude special ids (the original draws from the
    whole vocabulary); both keep static masking identical in distribution to :class:`BertPretrainingCollator`.
    """
    if whole_word_mask and subword_flags is None:
        raise ValueError("whole_word_mask=True needs subword_flags; compute them with continuation_mask_from_vocab")
    special = set(special_ids)
    if len(special) >= vocab_size:
        raise ValueError(f"all {vocab_size} ids are special; random replacements need at least one other id")

    cand_indexes: list[list[int]] = []
    for index, token_id in enumerate(input_ids):
        if token_id in special:
            continue
        # A continuation joins the previous candidate only if that candidate ends right before it: a "##" piece
        # just after [SEP] belongs to no word of segment A.
        if whole_word_mask and subword_flags[token_id] and cand_indexes and cand_indexes[-1][-1] == index - 1:
            cand_indexes[-1].append(index)
        else:
            cand_indexes.append([index])
    num_candidates = sum(len(group) for group in cand_indexes)
    if num_candidates == 0:
        return list(input_ids), [], []
    num_to_predict = min(max_predictions_per_seq, max(1, round(num_candidates * masked_lm_prob)))

    rng.shuffle(cand_indexes)
    output_ids = list(input_ids)
    positions: list[int] = []
    for group in cand_indexes:
        if len(positions) >= num_to_predict:
            break
        # A whole word that would overshoot the budget is skipped rather than masked in part.
        if len(positions) + len(group) > num_to_predict:
            continue
        for index in group:
            if rng.random() < MASK_FRACTION:
                output_ids[index] = mask_id
            elif rng.random() < 0.5:  # half of the remaining 20 %: keep the token
                pass
            else:
                output_ids[index] = _random_non_special_id(vocab_size, special, rng)
            positions.append(index)
    positions.sort()
    return output_ids, positions, [input_ids[index] for index in positions]


def _random_non_special_id(vocab_size: int, special: Collection[int], rng: random.Random) -> int:
    # Rejection sampling: special ids are a handful out of tens of thousands, so this almost never loops.
    while (token_id := rng.randrange(vocab_size)) in special:
        pass
    return token_id


def write_instances(instances: Sequence[TrainingInstance], path: str | Path, cls_id: int, sep_id: int) -> None:
    """Write ``instances`` as an uncompressed Arrow IPC file with :data:`INSTANCE_SCHEMA`, atomically.

    Uncompressed so that :func:`read_instances` can memory-map it without copies. The file appears under its
    final name only once complete, so a crashed or retried task never leaves a truncated file that a later stage
    would read.
    """
    features = [to_features(instance, cls_id, sep_id) for instance in instances]
    offsets = np.zeros(len(features) + 1, dtype=np.int32)
    np.cumsum([len(input_ids) for input_ids, _ in features], out=offsets[1:])
    input_ids = np.fromiter((t for ids, _ in features for t in ids), dtype=np.int32, count=int(offsets[-1]))
    token_types = np.fromiter((t for _, types in features for t in types), dtype=np.int8, count=int(offsets[-1]))
    pa_offsets = pa.array(offsets)
    table = pa.Table.from_arrays(
        [
            pa.ListArray.from_arrays(pa_offsets, pa.array(input_ids), type=INSTANCE_SCHEMA.field(0).type),
            pa.ListArray.from_arrays(pa_offsets, pa.array(token_types), type=INSTANCE_SCHEMA.field(1).type),
            pa.array(np.fromiter((i.is_random_next for i in instances), dtype=np.int8, count=len(instances))),
        ],
        schema=INSTANCE_SCHEMA,
    )
    with atomic_arrow_file(path, INSTANCE_SCHEMA) as writer:
        writer.write_table(table)


def read_instances(path: str | Path) -> pa.Table:
    """Memory-map an instance file written by :func:`write_instances` (pages are read on access, not up front)."""
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()
