"""Every block of a corpus as flat arrays, opened in milliseconds.

The shards (TFRecords) are the corpus, and reading them is one pass through
every block: seconds for the demo's 10,054 blocks, every time `ask`, `fill`
or `search` starts. The first reader therefore writes what it read beside
the shards, as .npy files that later readers memory-map: the token ids
(ragged, with offsets), the title lengths, the titles and the bodies. The
store is named by the corpus fingerprint, so a changed corpus (`corpus add`
or `remove`) is never read from a stale one; it is written into a
temporary directory and renamed, so a killed writer leaves none half
written. Its files' CRC-32C (`checksums`), whole and of each piece, are
written with it. A reader of every block (the trainer's retrieval, which
`search` and `ask` use too) checks every file when it opens it, and a
store that fails is read again from the shards. A reader of some blocks of
a store that can be gigabytes (the texts `ask` shows, an index builder's
share, the blocks a corpus sync adds) checks the pieces each read touches
instead.
A corpus on a remote or read-only file system is read from its shards each
time.

The store is also the corpus of the TF-free core (`realm_jax.extras`):
there the shards cannot be read, so a store must have been written where
TensorFlow is (`realm-jax data export` writes it, or any first reader).
"""

import logging
import os

import numpy as np
from etils import epath

from realm_jax import checksums, errors, extras
from realm_jax.data import corpus, example_arrays

log = logging.getLogger(__name__)

PREFIX = 'block_store-'
ARRAYS = ('token_ids', 'token_offsets', 'title_lengths', 'titles',
          'title_offsets', 'bodies', 'body_offsets')


class BlockStore:
  """Block i's wordpieces, title length, title and body, by id.

  `pieces`: the checks of a memory-mapped store's files, made as `read`
  touches them (None: checked whole when opened, or read from the shards).
  """

  def __init__(self, arrays: dict[str, np.ndarray],
               pieces: checksums.Pieces | None = None):
    self.arrays = arrays
    self.num_blocks = len(arrays['title_lengths'])
    self._pieces = pieces

  def read(self, name: str, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of array `name`, their bytes checked."""
    array = self.arrays[name]
    if self._pieces is not None:
      offset, size = array.offset, array.itemsize  # np.memmap's.
      self._pieces.check(f'{name}.npy', offset + int(start) * size,
                         offset + int(stop) * size)
    return array[start:stop]

  def token_ids(self, i: int) -> np.ndarray:
    start, stop = self.read('token_offsets', i, i + 2)
    return self.read('token_ids', start, stop).astype(np.int32)

  def title_length(self, i: int) -> int:
    return int(self.read('title_lengths', i, i + 1)[0])

  def _text(self, blob: str, offsets: str, i: int) -> str:
    start, stop = self.read(offsets, i, i + 2)
    return bytes(self.read(blob, start, stop)).decode('utf-8')

  def title(self, i: int) -> str:
    return self._text('titles', 'title_offsets', i)

  def body(self, i: int) -> str:
    return self._text('bodies', 'body_offsets', i)

  def articles(self) -> np.ndarray:
    """[num_blocks] each block's article, numbered in order: the builder
    writes an article's blocks one after another, each with its title, so
    a run of equal titles is one article."""
    offsets = self.read('title_offsets', 0, self.num_blocks + 1)
    titles = self.read('titles', 0, int(offsets[-1]))
    starts = [0] + [i for i in range(1, self.num_blocks) if bytes(
        titles[offsets[i]:offsets[i + 1]]) != bytes(
            titles[offsets[i - 1]:offsets[i]])]
    first = np.zeros(self.num_blocks, np.int64)
    first[starts] = 1
    return np.cumsum(first) - 1

  def padded(self, length: int, start: int = 0, stop: int | None = None
             ) -> dict[str, np.ndarray]:
    """token_ids/token_type_ids/input_mask [n, L] of blocks [start, stop),
    each cut to L = `length` wordpieces but still closed by its [SEP]; the
    title's [CLS] title [SEP] has type 0."""
    stop = self.num_blocks if stop is None else stop
    offsets = self.read('token_offsets', start, stop + 1).astype(np.int64)
    tokens = self.read('token_ids', offsets[0], offsets[-1])
    offsets -= offsets[0]
    lengths = np.diff(offsets)
    kept = np.minimum(lengths, length)
    columns = np.arange(length)
    inside = columns[None, :] < kept[:, None]
    # Column j of a cut block reads token j, and its last column the [SEP].
    source = offsets[:-1, None] + np.where(
        columns[None, :] == kept[:, None] - 1, lengths[:, None] - 1,
        columns[None, :])
    token_ids = np.where(inside, tokens[np.where(inside, source, 0)],
                         0).astype(np.int32)
    title_end = self.read('title_lengths', start, stop)[:, None] + 2
    return {'token_ids': token_ids, 'input_mask': inside.astype(np.int32),
            'token_type_ids': (inside & (columns[None, :] >= title_end)
                               ).astype(np.int32)}


def draw_siblings(articles: np.ndarray, block_ids, rng: np.random.Generator,
                  none: int) -> np.ndarray:
  """[B] another block of each block's article (`articles`, as
  `BlockStore.articles` numbers them), drawn uniformly, or `none` where
  the article is that block alone."""
  ids = np.asarray(block_ids)
  first = np.searchsorted(articles, articles[ids], side='left')
  count = np.searchsorted(articles, articles[ids], side='right') - first
  # One of the count - 1 others: from the block's own place on, one further.
  drawn = np.floor(rng.random(len(ids)) * np.maximum(count - 1, 1)
                   ).astype(np.int64)
  drawn += drawn >= ids - first
  return np.where(count > 1, first + drawn, none)


def _read_shards(corpus_dir: str) -> dict[str, np.ndarray]:
  token_ids, token_lengths, title_lengths = [], [], []
  texts = {'titles': [], 'bodies': []}
  for block in corpus.read_blocks(corpus_dir).as_numpy_iterator():
    token_ids.append(block['token_ids'])
    token_lengths.append(len(block['token_ids']))
    title_lengths.append(int(block['title_length']))
    texts['titles'].append(block['title'])
    texts['bodies'].append(block['body'])
  arrays = {
      # uint16 for BERT's vocabularies: half the bytes to map and carry.
      'token_ids': example_arrays.compact(
          np.concatenate(token_ids) if token_ids else np.zeros(0, np.int32)),
      'token_offsets': np.concatenate([[0], np.cumsum(token_lengths)]
                                      ).astype(np.int64),
      'title_lengths': np.asarray(title_lengths, np.int32)}
  for name, offsets in (('titles', 'title_offsets'),
                        ('bodies', 'body_offsets')):
    arrays[name] = np.frombuffer(b''.join(texts[name]), np.uint8)
    arrays[offsets] = np.concatenate(
        [[0], np.cumsum([len(t) for t in texts[name]])]).astype(np.int64)
  return arrays


def _remove(directory: epath.Path) -> None:
  try:
    directory.rmtree()
  except OSError:  # Gone already: another reader removed it.
    pass


def _write(directory: epath.Path, arrays: dict[str, np.ndarray]) -> None:
  """Into a temporary directory, renamed when whole; older stores go."""
  staged = directory.parent / f'{directory.name}.incomplete-{os.getpid()}'
  staged.mkdir(exist_ok=True)  # A killed writer's, of a reused pid.
  for name in ARRAYS:
    np.save(os.fspath(staged / f'{name}.npy'), arrays[name])
  checksums.write(staged, pieces=True)
  try:
    staged.rename(directory)
  except OSError:  # Another reader wrote it first.
    _remove(staged)
    return
  for old in directory.parent.glob(f'{PREFIX}*'):
    if old.name != directory.name:
      _remove(old)


def open_store(corpus_dir: str, whole: bool = True,
               fingerprint: str | None = None) -> BlockStore:
  """The corpus's block store: memory-mapped when written before, else read
  from the shards (and written, where the corpus lives on a local disk).
  `whole`: the caller reads every block, so every file is checked now;
  False checks each piece when a read first touches it. `fingerprint`: the
  corpus's, when its metadata was read already."""
  fingerprint = fingerprint or corpus.load_metadata(corpus_dir)[
      'corpus_fingerprint']
  local = '://' not in corpus_dir
  directory = epath.Path(corpus_dir) / f'{PREFIX}{fingerprint[:16]}'
  damaged = None
  if local and directory.is_dir():
    try:
      if whole:
        checksums.verify(directory)
        pieces = None
      else:
        pieces = checksums.open_pieces(directory)
      arrays = {name: np.load(os.fspath(directory / f'{name}.npy'),
                              mmap_mode='r') for name in ARRAYS}
      if pieces is not None:  # The .npy headers np.load has just read.
        for name, array in arrays.items():
          pieces.check(f'{name}.npy', 0, array.offset)
      return BlockStore(arrays, pieces)
    except (OSError, ValueError, errors.ChecksumMismatch) as error:
      damaged = error  # Read the shards.
  try:
    arrays = _read_shards(corpus_dir)
  except extras.MissingExtra as error:
    if damaged is None:
      raise
    # Without TensorFlow the store is the corpus's only readable copy.
    raise errors.BadInput(
        f'{directory} is unreadable ({damaged}), and rebuilding it from the '
        'shards needs TensorFlow: copy the block store again.') from error
  if damaged is not None:
    log.warning('%s was unreadable (%s); rebuilt from the corpus shards.',
                directory, damaged)
    _remove(directory)
  if local:
    try:
      _write(directory, arrays)
    except OSError as error:  # Read-only: read the shards next time too.
      log.info('block store not written to %s: %s', directory, error)
  return BlockStore(arrays)
