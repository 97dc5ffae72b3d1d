"""BERT's datasets: pretraining instances over the examples stage's Arrow files, masked batch by batch with a seed of
their own (resumable), and downstream sentence (pair) tasks encoded with the model's tokenizer."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from data_prep.bert_examples import BertPretrainingCollator
from pipeline.engine.arrow import list_column


class PretrainingInstances(Dataset):
    """Sentence-pair instances (input_ids, token_type_ids, next_sentence_label) from Arrow files.

    Rows are sliced out of the memory-mapped files on demand, so RAM does not grow with the corpus."""

    def __init__(self, tables: list[pa.Table]):
        self.parts = []
        for table in tables:
            if table.num_rows == 0:
                continue
            offsets, ids = list_column(table, "input_ids")
            _, types = list_column(table, "token_type_ids")
            nsp = table.column("next_sentence_label").to_numpy()
            self.parts.append((offsets, ids, types, nsp))
        self.cumulative = np.cumsum([len(p[3]) for p in self.parts])

    def __len__(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    def __getitem__(self, index: int) -> dict:
        part = int(np.searchsorted(self.cumulative, index, side="right"))
        row = index - (int(self.cumulative[part - 1]) if part else 0)
        offsets, ids, types, nsp = self.parts[part]
        start, end = offsets[row], offsets[row + 1]
        # A copy of one row (~0.5 KB): tensors must not alias the read-only memory map.
        return {"input_ids": ids[start:end].astype(np.int64), "token_type_ids": types[start:end].astype(np.int64),
                "next_sentence_label": int(nsp[row])}

    def token_counts(self, vocab_size: int, excluded: np.ndarray = np.empty(0, dtype=np.int64)) -> np.ndarray:
        """How often each token id occurs in the instances, leaving out those at indices `excluded` (a held-out
        set): one bincount per file over its memory-mapped ids, so memory is the vocabulary, not the corpus."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for _, ids, _, _ in self.parts:
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
