"""Corpus sources, tokenization and (later) masking."""
