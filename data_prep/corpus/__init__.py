"""Corpus preparation, shared by every family: books -> cleaned, deduplicated, decontaminated sentence shards
(`prepare`), and what turns their text into ids or vectors for any family (WordPiece and token-id shards, word
vectors)."""
