"""A built corpus changed in place: articles added, articles removed.

Block ids never change, so every index row keeps its meaning:
- added articles become blocks exactly as `build-corpus` makes them, with
  the next ids, in a shard of their own;
- removed blocks stay in their shards, listed in metadata.json's
  `removed_block_ids`; no searcher returns them (`index.exact`,
  `index.scann_searcher`), and their text is no longer shown or searched
  for answers.

Each change is one entry of the metadata's `lineage`: the fingerprint it
started from, what changed, and the fingerprint it gave, sha256 of the base
fingerprint and the change. An index embedded before a change is therefore
refused after it, naming both fingerprints, until `index.corpus_sync`
brings it up to date by embedding the added blocks alone. metadata.json is
replaced last, in one rename: a killed change leaves the corpus as it was,
with at most an unlisted shard file. Several changes that belong together
(a replaced article: removed, then added) are made on a copy and swapped
in whole (`transaction`).
"""

import contextlib
import hashlib
import json
import logging
import os

import numpy as np
from etils import epath

from realm_jax import errors
from realm_jax.data import corpus
from realm_jax.data.skips import SkipReport
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.progress import Progress

log = logging.getLogger(__name__)

REMOVED = 'removed_block_ids'
LINEAGE = 'lineage'


def _beside(corpus_dir: str, what: str) -> epath.Path:
  path = epath.Path(corpus_dir)
  return path.parent / f'{path.name}.{what}'


def _copy_tree(source: epath.Path, target: epath.Path) -> None:
  for directory, _, files in source.walk():
    into = target / directory.relative_to(source)
    into.mkdir(parents=True, exist_ok=True)
    for name in files:
      (directory / name).copy(into / name)


def recover(corpus_dir: str) -> None:
  """Ends what a killed `transaction` left: a copy swapped half in is
  swapped in whole (the original had been moved aside only once the copy
  was complete), and a copy not yet complete is dropped."""
  path = epath.Path(corpus_dir)
  staged, replaced = (_beside(corpus_dir, w) for w in ('staged', 'replaced'))
  if replaced.is_dir():
    if not path.is_dir():
      staged.rename(path)
    replaced.rmtree()
  staged.rmtree(missing_ok=True)


@contextlib.contextmanager
def transaction(corpus_dir: str):
  """Yields a copy of the corpus to change, swapped in when the block ends,
  so that a kill at any point leaves the corpus as it was or with every
  change once `recover` ran (the next transaction runs it first), and an
  error in the block leaves it as it was."""
  recover(corpus_dir)
  path = epath.Path(corpus_dir)
  staged, replaced = (_beside(corpus_dir, w) for w in ('staged', 'replaced'))
  _copy_tree(path, staged)
  try:
    yield os.fspath(staged)
  except Exception:  # The change refused: no copy left behind.
    staged.rmtree(missing_ok=True)
    raise
  path.rename(replaced)
  staged.rename(path)
  replaced.rmtree()


def removed_ids(metadata: dict) -> np.ndarray:
  """Sorted ids of the blocks removed from a corpus."""
  return np.asarray(metadata.get(REMOVED, []), np.int64)


def pending_changes(metadata: dict, fingerprint: str) -> list[dict] | None:
  """The changes that turned the corpus of `fingerprint` into this one, in
  order ([] when it is this one); None when it is no ancestor."""
  if fingerprint == metadata['corpus_fingerprint']:
    return []
  lineage = metadata.get(LINEAGE, [])
  for i, change in enumerate(lineage):
    if change['base_fingerprint'] == fingerprint:
      return lineage[i:]
  return None


def _commit(corpus_dir: str, metadata: dict, change: dict) -> dict:
  """metadata.json with `change` appended to the lineage, in one rename."""
  base = metadata['corpus_fingerprint']
  digest = hashlib.sha256(base.encode())
  digest.update(json.dumps(change, sort_keys=True).encode())
  change = {'base_fingerprint': base, **change,
            'fingerprint': digest.hexdigest()}
  metadata = {**metadata, 'corpus_fingerprint': change['fingerprint'],
              LINEAGE: [*metadata.get(LINEAGE, []), change]}
  path = epath.Path(corpus_dir) / corpus.METADATA
  staged = path.parent / (path.name + '.incomplete')
  staged.write_text(json.dumps(metadata, indent=1))
  staged.replace(path)
  return metadata


def _new_shard_name(metadata: dict) -> str:
  listed = {shard['path'] for shard in metadata['shards']}
  number = len(listed)
  while f'blocks-{number:05d}.tfrecord' in listed:
    number += 1
  return f'blocks-{number:05d}.tfrecord'


def add_articles(corpus_dir: str, tokenizer: WordPieceTokenizer,
                 jsonl_paths: list[str], articles_per_batch: int = 256
                 ) -> tuple[dict, range]:
  """Adds the articles of JSONL files (`{"title", "text"}` a line) as new
  blocks; returns the new metadata and the new blocks' ids."""
  for path in jsonl_paths:
    errors.require_file(path, 'JSONL file of articles')
  metadata = corpus.load_metadata(corpus_dir)
  corpus.require_vocab(corpus_dir, metadata, tokenizer.vocab_path)
  builder = corpus.CorpusBuilder(
      tokenizer, metadata['max_block_length'],
      metadata.get('max_title_length', corpus.MAX_TITLE_LENGTH))
  builder.report = SkipReport('corpus add')
  first = builder.next_id = metadata['num_blocks']
  name = _new_shard_name(metadata)
  shard = epath.Path(corpus_dir) / name
  staged = shard.parent / (name + '.incomplete')
  source_digest, blocks_digest = hashlib.sha256(), hashlib.sha256()
  size = sum(epath.Path(p).stat().length for p in jsonl_paths)
  progress = Progress('corpus add', size / 1e6, unit='MB')
  articles = corpus.read_jsonl_articles(jsonl_paths, builder.report, progress,
                                        source_digest)
  lengths = []

  def write(batch):
    for block in builder.blocks(batch):
      writer.write(block.to_example())
      lengths.append(len(block.token_ids))
      blocks_digest.update(np.asarray(block.token_ids, np.int32).tobytes())
      blocks_digest.update(b'|')

  with corpus.tensorflow().io.TFRecordWriter(str(staged)) as writer:
    batch = []
    for item in articles:
      batch.append(item)
      if len(batch) == articles_per_batch:
        write(batch)
        batch = []
    write(batch)
  if not lengths:
    staged.unlink()
    raise errors.BadInput(f'No block to add from {", ".join(jsonl_paths)}. '
                          + builder.report.summary())
  staged.rename(shard)
  log.info('%s', builder.report.summary())
  added = range(first, first + len(lengths))
  histogram = dict(metadata['length_histogram'])
  for bucket, count in corpus.length_histogram(
      lengths, metadata['max_block_length']).items():
    histogram[bucket] = histogram.get(bucket, 0) + count
  total = metadata['num_blocks'] + len(lengths)
  metadata = {
      **metadata, 'num_blocks': total,
      'shards': [*metadata['shards'], {'path': name,
                                       'num_blocks': len(lengths)}],
      'length_histogram': histogram,
      'mean_length': (metadata['mean_length'] * metadata['num_blocks']
                      + sum(lengths)) / total,
  }
  return _commit(corpus_dir, metadata, {
      'change': 'add', 'block_ids': [added.start, added.stop],
      'sources': list(jsonl_paths),
      'source_fingerprint': source_digest.hexdigest(),
      'blocks_fingerprint': blocks_digest.hexdigest(),
      'skipped': builder.report.as_dict()}), added


def remove_titles(corpus_dir: str, titles_path: str) -> tuple[dict, list[int]]:
  """Removes every block of the articles titled in `titles_path` (one title
  a line); returns the new metadata and the removed ids. Titles that match
  no block are reported; a file that matches none is refused."""
  errors.require_file(titles_path, 'file of titles')
  wanted = {line.strip() for line in
            epath.Path(titles_path).read_text().splitlines() if line.strip()}
  if not wanted:
    raise errors.BadInput(f'{titles_path}: no title to remove.')
  metadata = corpus.load_metadata(corpus_dir)
  already = set(removed_ids(metadata).tolist())
  found, ids = set(), []
  for block in corpus.read_blocks(corpus_dir).as_numpy_iterator():
    title = block['title'].decode('utf-8')
    if title in wanted and int(block['block_id']) not in already:
      found.add(title)
      ids.append(int(block['block_id']))
  missing = sorted(wanted - found)
  if not ids:
    raise errors.BadInput(f'{titles_path}: no block of {corpus_dir} is titled '
                          + ', '.join(repr(t) for t in missing[:5])
                          + (' ...' if len(missing) > 5 else '')
                          + ' (or all were removed already).')
  metadata = {**metadata, REMOVED: sorted(already | set(ids))}
  return _commit(corpus_dir, metadata, {
      'change': 'remove', 'block_ids': ids, 'source': titles_path,
      'titles': sorted(found), 'titles_not_found': missing}), ids
