"""Flax modules: BERT, the REALM retriever and reader, and their losses."""
