"""A corpus directory read once: its metadata, and its block store when first
asked for.

The index builder, a corpus sync, `embed` and the trainer's retrieval each
need a corpus's metadata (its fingerprint, block count and block cut) and
its blocks. Opened here once, where a command starts, and passed down, the
directory is not read again at every layer on the way.
"""

from realm_jax import errors
from realm_jax.data import block_store, corpus


class OpenCorpus:
  """The corpus at `directory`: `metadata` as its metadata.json holds it,
  and `store`, its block store."""

  def __init__(self, directory: str):
    self.directory = directory
    self.metadata = corpus.load_metadata(directory)
    self._stores = {}

  @property
  def fingerprint(self) -> str:
    return self.metadata['corpus_fingerprint']

  @property
  def num_blocks(self) -> int:
    return self.metadata['num_blocks']

  def store(self, whole: bool = True) -> block_store.BlockStore:
    """The block store, opened once for each way of checking it (`whole`:
    every file at open; else each piece as a read first touches it)."""
    if whole not in self._stores:
      self._stores[whole] = block_store.open_store(self.directory, whole,
                                                   self.fingerprint)
    return self._stores[whole]

  def padded(self, length: int | None = None, start: int = 0,
             stop: int | None = None) -> dict:
    """token_ids/token_type_ids/input_mask [n, L] of blocks [start, stop),
    cut to L = `length` wordpieces (None: the corpus's own cut). Only the
    pieces of the store these blocks lie in are checked, as they are read
    (an index builder's share, the blocks a corpus sync adds); a damaged
    one has the store read again from the shards."""
    length = length or self.metadata['max_block_length']
    try:
      return self.store(whole=False).padded(length, start, stop)
    except errors.ChecksumMismatch:
      self._stores.clear()  # Checked whole now: rebuilt from the shards.
      return self.store().padded(length, start, stop)
