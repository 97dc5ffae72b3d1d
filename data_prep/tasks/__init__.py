"""Readers of the downstream tasks' files: CoNLL tagging, SQuAD, the SentEval-style probing tasks."""
