"""BERT's datasets: pretraining instances over the bert_examples stage's Arrow files, masked batch by batch with a
seed of their own (resumable), and downstream sentence (pair) tasks encoded with the model's tokenizer."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from data_prep.corpus.tokenizer import encode_batch_ids
from data_prep.examples.bert_examples import MASK_FRACTION, RANDOM_FRACTION
from models import IGNORE_INDEX
from pipeline.bert.settings import Masking
from pipeline.engine.loaders import ArrowRows

# SpanBERT's span lengths (Joshi et al. 2020, §3.1): in whole words, geometric with p = 0.2, truncated at 10 words
# and renormalised (their masking.py), mean 3.8 words; clipping instead would pile the tail on 10, mean 4.5.
SPAN_GEOMETRIC_P, MAX_SPAN_WORDS = 0.2, 10
SPAN_LENGTH_PROBABILITIES = (1 - SPAN_GEOMETRIC_P) ** torch.arange(MAX_SPAN_WORDS, dtype=torch.float64)  # 1, 2, ...
SPAN_LENGTH_PROBABILITIES /= SPAN_LENGTH_PROBABILITIES.sum()  # p (1 - p)^(l - 1) up to the normalisation
# span draws per masked piece a row may use: each kept draw masks at least one piece; the spare ones are redrawn
# starts (a word already chosen, or longer than what is left of the count)
SPAN_ATTEMPTS_PER_PREDICTION = 4


def segment_apart(row: Mapping[str, object], segment: int) -> dict[str, np.ndarray]:
    """Segment 0 ([CLS] A [SEP]) or 1 (B [SEP] after the row's [CLS]) of a pair instance, as a row of its own."""
    ids, types = np.asarray(row["input_ids"]), np.asarray(row["token_type_ids"])
    if not (types == 1).any():
        raise ValueError("a contrastive loss between segments needs sentence-pair instances with a second segment "
                         "(examples.packing=sentence_pairs)")
    kept = ids[types == 0] if segment == 0 else np.concatenate([ids[:1], ids[types == 1]])
    return {"input_ids": kept, "token_type_ids": np.zeros_like(kept)}


class BertPretrainingCollator:
    """Pads a list of instance rows and applies dynamic masked-LM masking (RoBERTa-style).

    Rows are mappings with ``input_ids``, ``token_type_ids`` (lists or numpy arrays of ints, e.g. rows of
    ``read_instances(path).to_pylist()``) and ``next_sentence_label``. Per sequence,
    ``round(mlm_probability * n)`` of the ``n`` maskable tokens (not in ``special_ids``, not padding) are chosen,
    at least 1 and at most ``max_predictions_per_seq`` -- the fixed count of google-research/bert, not an
    independent coin per token -- then replaced 80 % by [MASK], 10 % by a random non-special id, 10 % kept.

    Returns int64 tensors: ``input_ids``, ``token_type_ids``, ``attention_mask`` (B, T) with T the longest row;
    ``mlm_positions`` and ``mlm_labels`` (B, P) with P the most predictions in the batch, padded with position 0
    and label IGNORE_INDEX; ``next_sentence_label`` (B,). Positions + labels instead of a (B, T) label tensor let the
    model gather the P hidden states and run the vocabulary projection only there (as run_pretraining.py's
    gather_indexes does), instead of over all T.

    ``masking`` (pipeline/bert/settings.py MASKINGS) is the unit chosen. ``token``: pieces, as above. ``whole_word``
    (Devlin et al.'s 2019 update of the released models; seed 003): the pieces of a word are chosen together, words in
    random order until the next would overshoot the count, so a masked piece cannot be read off the rest of its word
    ("un ##believ [MASK]"). ``span`` (SpanBERT, Joshi et al. 2020, §3.1): runs of whole words, each of a length drawn
    from a geometric distribution (SPAN_LENGTH_PROBABILITIES) and starting at a uniformly drawn word, until the count
    is reached, each run's 80/10/10 decided once for all its pieces; a masked word cannot be read off its neighbours.
    Both need ``continuation``, a bool per vocabulary id, True for a "##" piece (data_prep.examples.bert_examples'
    continuation_mask_from_vocab).

    ``split_segments`` encodes the two segments of each pair apart, for a contrastive loss between them (pipeline/bert/
    module.py): the n rows [CLS] A [SEP] B [SEP] become 2n rows, [CLS] A [SEP] for each pair, then [CLS] B [SEP] in
    the same order, all of segment 0; ``next_sentence_label`` stays one per pair (n,).

    ``generator`` makes masking reproducible in a single process. Do not pass one to a DataLoader with workers:
    each worker would get a copy of the same generator state and draw identical masks; with ``None`` torch's
    global RNG is used, which DataLoader seeds differently in every worker.
    """

    def __init__(
        self,
        pad_id: int,
        mask_id: int,
        vocab_size: int,
        special_ids: Collection[int],
        mlm_probability: float = 0.15,
        max_predictions_per_seq: int = 20,
        generator: torch.Generator | None = None,
        masking: Masking = Masking.token,
        continuation: Sequence[bool] | None = None,
        split_segments: bool = False,
    ) -> None:
        if masking != Masking.token and continuation is None:
            raise ValueError(f"masking={masking} needs continuation, which pieces continue a word: compute it with "
                             "data_prep.examples.bert_examples.continuation_mask_from_vocab(tokenizer)")
        self.masking = Masking(masking)
        self.split_segments = split_segments
        self.pad_id = pad_id
        self.mask_id = mask_id
        self.mlm_probability = mlm_probability
        self.max_predictions_per_seq = max_predictions_per_seq
        self.generator = generator
        self.special_ids = torch.tensor(sorted({*special_ids, pad_id}), dtype=torch.long)
        is_special = torch.zeros(vocab_size, dtype=torch.bool)
        is_special[self.special_ids] = True
        self.replacement_ids = torch.nonzero(~is_special).squeeze(1)
        if len(self.replacement_ids) == 0:
            raise ValueError(f"all {vocab_size} ids are special; random replacements need at least one other id")
        self.continuation = None if continuation is None else torch.as_tensor(np.asarray(continuation, dtype=bool))

    def _choose_tokens(self, input_ids: torch.Tensor, maskable: torch.Tensor,
                       num_to_predict: torch.Tensor) -> torch.Tensor:
        """Exactly k of the maskable tokens of each row, uniformly: each gets a uniform score, ineligible ones a score
        above every eligible one, and the k lowest are taken."""
        batch_size, seq_length = maskable.shape
        scores = torch.rand((batch_size, seq_length), generator=self.generator).masked_fill_(~maskable, 2.0)
        ranks = torch.empty((batch_size, seq_length), dtype=torch.long)
        ranks.scatter_(1, scores.argsort(dim=1), torch.arange(seq_length).expand(batch_size, -1).contiguous())
        return ranks < num_to_predict.unsqueeze(1)

    def _choose_whole_words(self, input_ids: torch.Tensor, maskable: torch.Tensor,
                            num_to_predict: torch.Tensor) -> torch.Tensor:
        """Whole words, in a uniformly random order, while their pieces add up to at most k per row. A word is a
        maskable piece that is no continuation, with the continuations right after it."""
        batch_size, seq_length = maskable.shape
        word = torch.cumsum(self._word_starts(input_ids, maskable), dim=1)  # (B, T): the 1-based word of each piece
        word_scores = torch.rand((batch_size, seq_length + 1), generator=self.generator)
        scores = word_scores.gather(1, word).masked_fill_(~maskable, 2.0)  # a word's pieces share its score
        order = scores.argsort(dim=1, stable=True)  # a word's pieces stay together, in reading order
        taken = torch.empty((batch_size, seq_length), dtype=torch.long)
        taken.scatter_(1, order, torch.arange(1, seq_length + 1).expand(batch_size, -1).contiguous())
        # pieces counted up to each word's last piece: within k, the word is chosen
        through_word = torch.zeros((batch_size, seq_length + 1), dtype=torch.long).scatter_reduce_(
            1, word, taken.masked_fill(~maskable, 0), reduce="amax")
        return maskable & (through_word.gather(1, word) <= num_to_predict.unsqueeze(1))

    def _word_starts(self, input_ids: torch.Tensor, maskable: torch.Tensor) -> torch.Tensor:
        """(B, T) True at each word's first piece: a maskable piece that is no continuation, or one right after a
        special token or padding (a continuation there starts a word of its own)."""
        after_unmaskable = ~torch.cat([torch.zeros(len(maskable), 1, dtype=torch.bool), maskable[:, :-1]], dim=1)
        return maskable & (~self.continuation[input_ids] | after_unmaskable)

    def _choose_spans(self, input_ids: torch.Tensor, maskable: torch.Tensor,
                      num_to_predict: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SpanBERT's masking (Joshi et al. 2020, §3.1, and their PairWithSpanMaskingScheme): per row, draw a span
        length in words (SPAN_LENGTH_PROBABILITIES) and a start word uniformly, and choose that many words from it,
        while the row's chosen pieces stay within its count k: a span stops at the word that would overshoot it, at a
        special token (it never crosses [SEP]) and at a word already chosen; a start word already chosen, or too long
        for what is left of k, is drawn again. At most SPAN_ATTEMPTS_PER_PREDICTION * k draws per row, so the loop
        ends when no word fits the rest of the count. Returns the chosen pieces and, for each, the position of its
        span's first piece, whose draw decides the span's 80/10/10."""
        batch_size, seq_length = maskable.shape
        starts = self._word_starts(input_ids, maskable)
        attempts = SPAN_ATTEMPTS_PER_PREDICTION * int(num_to_predict.max())
        # drawn for the whole batch at once, so the generator's stream does not depend on how many draws a row used
        span_words = 1 + torch.multinomial(SPAN_LENGTH_PROBABILITIES.expand(batch_size, -1), attempts,
                                           replacement=True, generator=self.generator)
        start_draws = torch.rand((batch_size, attempts), generator=self.generator)
        # a word is [start, end): from its start to the next boundary (a word's start or an unmaskable token)
        position = torch.arange(seq_length + 1).expand(batch_size, -1)
        boundary = torch.cat([starts | ~maskable, torch.ones(batch_size, 1, dtype=torch.bool)], dim=1)
        next_boundary = position.masked_fill(~boundary, seq_length).flip(1).cummin(dim=1).values.flip(1)
        chosen = torch.zeros((batch_size, seq_length), dtype=torch.bool)
        decided_at = torch.arange(seq_length).repeat(batch_size, 1)
        for b in range(batch_size):
            word_starts = torch.nonzero(starts[b]).squeeze(1)
            ends = next_boundary[b, word_starts + 1].tolist()
            word_starts = word_starts.tolist()
            if not word_starts:
                continue
            word_chosen = [False] * len(word_starts)
            budget = int(num_to_predict[b])
            for length, draw in zip(span_words[b].tolist(), start_draws[b].tolist()):
                if budget == 0:
                    break
                first = int(draw * len(word_starts))
                if word_chosen[first] or ends[first] - word_starts[first] > budget:
                    continue
                word = first
                while (word < first + length and word < len(word_starts) and not word_chosen[word]
                       and ends[word] - word_starts[word] <= budget
                       and (word == first or word_starts[word] == ends[word - 1])):  # contiguous: same segment
                    word_chosen[word] = True
                    budget -= ends[word] - word_starts[word]
                    chosen[b, word_starts[word]:ends[word]] = True
                    decided_at[b, word_starts[word]:ends[word]] = word_starts[first]
                    word += 1
        return chosen, decided_at

    def __call__(self, rows: Sequence[Mapping[str, object]]) -> dict[str, torch.Tensor]:
        next_sentence_label = torch.tensor([int(row["next_sentence_label"]) for row in rows], dtype=torch.long)
        if self.split_segments:
            rows = [segment for i in (0, 1) for segment in (segment_apart(row, i) for row in rows)]
        batch_size = len(rows)
        seq_length = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((batch_size, seq_length), self.pad_id, dtype=torch.long)
        token_type_ids = torch.zeros((batch_size, seq_length), dtype=torch.long)
        attention_mask = torch.zeros((batch_size, seq_length), dtype=torch.long)
        for b, row in enumerate(rows):
            length = len(row["input_ids"])
            input_ids[b, :length] = torch.as_tensor(row["input_ids"])
            token_type_ids[b, :length] = torch.as_tensor(row["token_type_ids"])
            attention_mask[b, :length] = 1

        maskable = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids)
        num_maskable = maskable.sum(dim=1)
        num_to_predict = torch.clamp(
            torch.round(num_maskable * self.mlm_probability).long(), min=1, max=self.max_predictions_per_seq
        ).minimum(num_maskable)
        if self.masking == Masking.span:
            chosen, decided_at = self._choose_spans(input_ids, maskable, num_to_predict)
        else:
            chosen = (self._choose_tokens if self.masking == Masking.token
                      else self._choose_whole_words)(input_ids, maskable, num_to_predict)
            decided_at = torch.arange(seq_length).expand(batch_size, -1)  # each piece's own draw

        num_predictions = int(num_to_predict.max())
        # Chosen positions in increasing order first, then the sentinel seq_length for padding slots.
        positions = torch.where(chosen, torch.arange(seq_length), seq_length).sort(dim=1).values[:, :num_predictions]
        is_prediction = positions < seq_length
        mlm_positions = positions.masked_fill(~is_prediction, 0)
        mlm_labels = input_ids.gather(1, mlm_positions).masked_fill_(~is_prediction, IGNORE_INDEX)

        # 80/10/10 by the draw at decided_at: the piece's own, or its span's first piece's (SpanBERT masks, replaces or
        # keeps a span as a whole)
        action = torch.rand((batch_size, seq_length), generator=self.generator).gather(1, decided_at)
        replace_with_mask = chosen & (action < MASK_FRACTION)
        replace_with_random = chosen & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
        random_ids = self.replacement_ids[
            torch.randint(len(self.replacement_ids), (batch_size, seq_length), generator=self.generator)
        ]
        masked_input_ids = input_ids.masked_fill(replace_with_mask, self.mask_id)
        masked_input_ids = torch.where(replace_with_random, random_ids, masked_input_ids)

        return {
            "input_ids": masked_input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
            "mlm_positions": mlm_positions,
            "mlm_labels": mlm_labels,
            "next_sentence_label": next_sentence_label,
        }


class PretrainingInstances(ArrowRows):
    """Sentence-pair instances (input_ids, token_type_ids, next_sentence_label) from Arrow files, sliced out of the
    memory-mapped files on demand."""

    def __init__(self, tables: list[pa.Table]):
        super().__init__(tables, ("input_ids", "token_type_ids"), ("next_sentence_label",))

    def token_total(self) -> int:
        """The tokens of all instances."""
        return sum(len(ids) for ids in self.values("input_ids"))

    def token_counts(self, vocab_size: int, excluded: np.ndarray = np.empty(0, dtype=np.int64)) -> np.ndarray:
        """How often each token id occurs in the instances, leaving out those at indices `excluded` (a held-out
        set): one bincount per file over its memory-mapped ids, so memory is the vocabulary, not the corpus."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for ids in self.values("input_ids"):
            counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
        if len(excluded):
            held_out = np.concatenate([self[int(index)]["input_ids"] for index in excluded])
            counts -= np.bincount(held_out, minlength=vocab_size)[:vocab_size]
        return counts


class EncodedTask(Dataset):
    """A downstream split encoded once with the pipeline's tokenizer: [CLS] a [SEP] (b [SEP])."""

    def __init__(self, tokenizer, texts_a: list[str], texts_b: list[str] | None, labels: list[int] | list[float],
                 max_seq_length: int):
        tokenizer.enable_truncation(max_length=max_seq_length)
        encodings = (tokenizer.encode_batch(list(zip(texts_a, texts_b))) if texts_b is not None
                     else tokenizer.encode_batch(texts_a))
        tokenizer.no_truncation()
        self.rows = [(np.asarray(e.ids, dtype=np.int64), np.asarray(e.type_ids, dtype=np.int64))
                     for e in encodings]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        ids, types = self.rows[index]
        return {"input_ids": ids, "token_type_ids": types, "label": self.labels[index]}


def prompt_ids(tokenizer, template: str, texts: list[str], max_seq_length: int) -> list[list[int]]:
    """[CLS] template-with-text [SEP] as ids, for prompt-based classification (models.bert.BertForPromptClassification):
    `template` holds `{text}` and `[MASK]` once each ("a [MASK] film . {text}"). The text is cut to what the template
    leaves of max_seq_length, so the [MASK] and its context are always there."""
    if template.count("{text}") != 1 or template.count("[MASK]") != 1:
        raise ValueError(f"prompt template {template!r} must hold {{text}} and [MASK] once each")
    mask, cls, sep = (tokenizer.token_to_id(token) for token in ("[MASK]", "[CLS]", "[SEP]"))

    def fragment(text: str) -> list[int]:  # a side of {text}, its [MASK] as the mask id
        pieces = [encode_batch_ids(tokenizer, [chunk])[0] if chunk.strip() else [] for chunk in text.split("[MASK]")]
        return [*pieces[0], mask, *pieces[1]] if len(pieces) == 2 else pieces[0]

    # The template's words are encoded apart from the text: BERT's pre-tokenizer splits at spaces and punctuation, so
    # no piece crosses the boundary and the ids are those of the joined text.
    before, after = (fragment(side) for side in template.split("{text}"))
    room = max_seq_length - 2 - len(before) - len(after)
    if room < 1:
        raise ValueError(f"prompt template {template!r} leaves no room for the text in max_seq_length="
                         f"{max_seq_length} pieces; raise finetune.max_seq_length")
    return [[cls, *before, *ids[:room], *after, sep] for ids in encode_batch_ids(tokenizer, texts)]


class EncodedPromptTask(EncodedTask):
    """A single-sentence split in a prompt template (prompt_ids), for BertForPromptClassification."""

    def __init__(self, tokenizer, template: str, texts: list[str], labels: list[int], max_seq_length: int):
        self.rows = [(np.asarray(ids, dtype=np.int64), np.zeros(len(ids), dtype=np.int64))
                     for ids in prompt_ids(tokenizer, template, texts, max_seq_length)]
        self.labels = labels


def pad_classification_batch(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    length = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r["input_ids"])] = torch.as_tensor(r["input_ids"])
        token_type_ids[i, : len(r["token_type_ids"])] = torch.as_tensor(r["token_type_ids"])
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": (input_ids != pad_id).long(),
            # float labels are regression targets (STS-B, task `labels: null`): a long tensor would truncate them
            "labels": torch.tensor([r["label"] for r in rows],
                                   dtype=torch.float32 if isinstance(rows[0]["label"], float) else torch.long)}


class MaskedBatches(Dataset):
    """Batches keyed by `(seed, indices)` (SeededBatchSampler): rows gathered, padded and masked with that seed."""

    def __init__(self, rows: Dataset, collator: BertPretrainingCollator):
        self.rows, self.collator = rows, collator

    def __getitem__(self, key: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
        seed, indices = key
        self.collator.generator = torch.Generator().manual_seed(seed)
        return self.collator([self.rows[i] for i in indices])
