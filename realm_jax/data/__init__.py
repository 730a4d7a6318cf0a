"""Corpus, tokenization, salient spans, masking, ICT and Open-QA data."""
