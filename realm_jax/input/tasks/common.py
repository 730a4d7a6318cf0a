"""What the tasks share: the WordPiece vocabulary and the known corpora."""

import functools

import seqio

from realm_jax import default_files
from realm_jax.data.vocabulary import WordPieceVocabulary

VOCAB_ENV = default_files.VOCAB_ENV
# The embedded default corpus: the Wikipedia leads, built by
# `realm-jax data build-corpus` into $REALM_CORPUS_DIR/wiki_leads.
CORPORA = ('wiki_leads',)


@functools.cache
def vocabulary() -> WordPieceVocabulary:
  """BERT's uncased vocab ($REALM_VOCAB, else the embedded MiniLM's)."""
  return WordPieceVocabulary(default_files.task_vocab())


def token_feature(required: bool = True) -> seqio.Feature:
  return seqio.Feature(vocabulary(), add_eos=False, required=required)


def int_feature(rank: int = 1) -> seqio.Feature:
  return seqio.Feature(seqio.PassThroughVocabulary(0), add_eos=False,
                       rank=rank)


def add_task(name: str, **task) -> None:
  """Registers a seqio task unless it is already: registering is explicit
  (`realm_jax.input.tasks.register`) and may be asked for more than once."""
  if name not in seqio.TaskRegistry.names():
    seqio.TaskRegistry.add(name, **task)
