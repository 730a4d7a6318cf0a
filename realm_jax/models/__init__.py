"""Flax modules: BERT and (later) the REALM retriever and reader."""
