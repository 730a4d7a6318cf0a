"""A run's index brought up to date with its changed corpus.

After `data.corpus_changes` adds or removes articles, a run's newest index no
longer matches the corpus fingerprint, and every reader refuses it.
`sync_index` replays the changes made since the index's fingerprint: the
added blocks alone are embedded, with the towers that embedded the rest
(the checkpoint or retriever snapshot of the index's `params_step`, or the
run it was copied from),
appended to the index's rows and published as the next step. That step keeps
its `params_step`: it is exactly as stale as the index it came from. Removed
blocks keep their rows; the searchers skip them. It publishes as a builder
does, so it holds the builder's lock: a sync beside a running builder is
refused, naming it, as a second builder is.
"""

import logging
import time

import numpy as np
from etils import epath

from realm_jax import errors, run_directory, run_guard
from realm_jax.data import corpus_changes
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.index.embed import DocumentEmbedder
from realm_jax.index.scann_searcher import build_scann

log = logging.getLogger(__name__)


def _document_tower(model_dir: str, metadata: dict) -> dict:
  """The retriever parameters that embedded an index."""
  params_step = metadata['params_step']
  steps = run_directory.RetrieverSteps(model_dir)
  if params_step in steps.reload():
    params = steps.restore(params_step)
    if params is not None:
      return params
  source = metadata.get(publication.EMBEDDED_BY)
  if source is None:
    raise errors.NotFound(
        f'{model_dir} no longer keeps step {params_step}, whose towers '
        'embedded its index: new blocks cannot be embedded like the rest. '
        'Embed the whole corpus again (`realm-jax embed`).')
  return run_directory.restore_params(source['model_dir'],
                                      source['step'])[1]['retriever']


def _newest(model_dir: str):
  """(index manager, newest step, its metadata) of model_dir's index."""
  directory = run_directory.index_dir(model_dir)
  if not epath.Path(directory).is_dir():
    raise errors.NotFound(f'No index under {directory} to bring up to date.')
  manager = publication.index_manager(directory)
  steps = run_directory.reload(manager)
  if not steps:
    raise errors.NotFound(f'No index under {directory} to bring up to date.')
  metadata = publication.read_metadata(manager, steps[-1])
  metadata.setdefault('params_step', steps[-1])
  return manager, steps[-1], metadata


def newest_metadata(model_dir: str) -> dict:
  """The metadata of model_dir's newest index ('synced_from' where
  `sync_index` published it)."""
  return _newest(model_dir)[2]


def sync_index(model_dir: str, corpus_dir: str, retriever,
               batch_size: int = 64) -> dict | None:
  """Publishes model_dir's newest index with the corpus's changes since it;
  returns the new step's metadata ('synced_from' says what was embedded,
  in how many seconds), None when the index is up to date."""
  with run_guard.BuilderLock(model_dir):
    return _sync_index(model_dir, corpus_dir, retriever, batch_size)


def _sync_index(model_dir: str, corpus_dir: str, retriever,
                batch_size: int) -> dict | None:
  opened = OpenCorpus(corpus_dir)
  corpus_metadata = opened.metadata
  directory = run_directory.index_dir(model_dir)
  manager, step, metadata = _newest(model_dir)
  changes = corpus_changes.pending_changes(corpus_metadata,
                                           metadata['corpus_fingerprint'])
  if changes is None:
    raise errors.IndexMismatchError(
        f'Index {directory}/{step} embeds corpus '
        f'{metadata["corpus_fingerprint"]}, which {corpus_dir} (corpus '
        f'{corpus_metadata["corpus_fingerprint"]}) did not change from: '
        'embed that corpus anew instead.')
  if not changes:
    return None
  embeddings = publication.read_embeddings(manager, step)
  added = [range(*c['block_ids']) for c in changes if c['change'] == 'add']
  started = time.perf_counter()
  rows = [embeddings]
  if added:
    embedder = DocumentEmbedder(retriever, batch_size)
    params = _document_tower(model_dir, metadata)
    for ids in added:
      rows.append(np.asarray(embedder(params, opened.padded(
          metadata['block_length'], ids.start, ids.stop))))
  seconds = time.perf_counter() - started
  embeddings = np.concatenate(rows).astype(embeddings.dtype)
  if len(embeddings) != corpus_metadata['num_blocks']:
    raise ValueError(f'{corpus_dir} holds {corpus_metadata["num_blocks"]:,} '
                     f'blocks; the synced index {len(embeddings):,}.')
  new = publication.index_metadata(
      corpus_metadata, embeddings, step + 1, metadata['searcher'],
      metadata['block_length'], metadata['params_step'])
  if publication.EMBEDDED_BY in metadata:
    new[publication.EMBEDDED_BY] = metadata[publication.EMBEDDED_BY]
  num_added = sum(len(ids) for ids in added)
  # The lineage: the index it came from, and each change since.
  new['synced_from'] = {
      'step': step, 'base_fingerprint': metadata['corpus_fingerprint'],
      'changes': [{'change': c['change'], 'fingerprint': c['fingerprint'],
                   'blocks': (c['block_ids'][1] - c['block_ids'][0]
                              if c['change'] == 'add' else
                              len(c['block_ids']))} for c in changes],
      'blocks_embedded': num_added, 'seconds': seconds}
  publication.publish(manager, step + 1, embeddings, new,
                      build_scann(embeddings)
                      if metadata['searcher'] == 'scann' else None)
  log.info('index step %d: step %d with %d change(s) of %s, %d block(s) '
           'embedded in %.1f s', step + 1, step, len(changes), corpus_dir,
           num_added, seconds)
  return new
