"""Published indexes: embed, save, load and check one index step.

An index step (model_dir/index/<step>, see `run_directory`) holds the corpus
embedded by the towers of trainer step `params_step` (the step itself,
except for an index brought up to date with a changed corpus, see
`corpus_sync`): its embeddings [N, D], its metadata (corpus fingerprint,
block cut, size) and, for ScaNN, the searcher's own files; each item with
the CRC-32C of its files (`checksums`). The builder publishes one per due
checkpoint; the trainer publishes its first one when it starts without
any. Readers check the metadata against their corpus and model before they
search, and never return the corpus's removed blocks.
"""

import dataclasses
import logging
import os
import time
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import checksums, distributed, errors, run_directory, run_guard
from realm_jax.data import corpus_changes
from realm_jax.errors import IndexMismatchError
from realm_jax.index.embed import DocumentEmbedder, embed_corpus
from realm_jax.index.exact import ExactSearcher
from realm_jax.index.scann_searcher import ScannSearcher, build_scann

log = logging.getLogger(__name__)

SEARCHERS = ('exact', 'scann')
# Metadata of an index copied from another run: that run's model_dir and the
# step whose towers embedded it.
EMBEDDED_BY = 'embedded_by'


EMBEDDINGS_FILE = 'embeddings.npy'
# Rows written at a time: 32 MiB of 128-dim float32 embeddings.
WRITE_ROWS = 65536


@dataclasses.dataclass(frozen=True)
class Rows:
  """[num_blocks, dim] embeddings read a slice at a time: an array in
  memory, or 13M released embeddings (6.8 GB) that must not be loaded whole."""
  shape: tuple[int, int]
  dtype: np.dtype
  read: Callable[[int, int], np.ndarray]  # (start, stop) -> those rows

  @classmethod
  def of(cls, array: np.ndarray) -> 'Rows':
    return cls(array.shape, array.dtype, lambda start, stop: array[start:stop])


class EmbeddingsHandler(checksums.checksummed(ocp.CheckpointHandler)):
  """An index's embeddings as one .npy file, written a slice at a time.

  Orbax's standard handler copies an array twice on its way to disk, so a
  6.8 GB index would need three times its size in memory; this one needs a
  slice. Only the primary process writes (every process holds the same
  embeddings).
  """

  def save(self, directory: epath.Path, args: 'EmbeddingsSave') -> None:
    if jax.process_index() != 0:
      return
    rows = args.rows
    with (directory / EMBEDDINGS_FILE).open('wb') as f:
      np.lib.format.write_array_header_1_0(f, {
          'descr': np.lib.format.dtype_to_descr(np.dtype(rows.dtype)),
          'fortran_order': False, 'shape': tuple(rows.shape)})
      for start in range(0, rows.shape[0], WRITE_ROWS):
        stop = min(start + WRITE_ROWS, rows.shape[0])
        f.write(np.ascontiguousarray(rows.read(start, stop),
                                     rows.dtype).tobytes())

  def restore(self, directory: epath.Path,
              args: 'EmbeddingsRestore | None' = None) -> np.ndarray:
    with (directory / EMBEDDINGS_FILE).open('rb') as f:
      return np.load(f)

  def metadata(self, directory: epath.Path) -> None:
    return None


@ocp.args.register_with_handler(EmbeddingsHandler, for_save=True)
@dataclasses.dataclass
class EmbeddingsSave(ocp.args.CheckpointArgs):
  rows: Rows


@ocp.args.register_with_handler(EmbeddingsHandler, for_restore=True)
@dataclasses.dataclass
class EmbeddingsRestore(ocp.args.CheckpointArgs):
  pass


class ScannHandler(checksums.checksummed(ocp.CheckpointHandler)):
  """Stores a ScaNN index as its own serialized files inside a checkpoint."""

  def save(self, directory: epath.Path, args: 'ScannSave') -> None:
    args.searcher.serialize(str(directory))

  def restore(self, directory: epath.Path,
              args: 'ScannRestore | None' = None) -> ScannSearcher:
    return ScannSearcher.load(str(directory))

  def metadata(self, directory: epath.Path) -> None:
    return None


@ocp.args.register_with_handler(ScannHandler, for_save=True)
@dataclasses.dataclass
class ScannSave(ocp.args.CheckpointArgs):
  searcher: ScannSearcher


@ocp.args.register_with_handler(ScannHandler, for_restore=True)
@dataclasses.dataclass
class ScannRestore(ocp.args.CheckpointArgs):
  pass


def index_manager(directory: str, read_only: bool = False,
                  max_to_keep: int = 3) -> ocp.CheckpointManager:
  """Orbax manager of an index directory (usually
  `run_directory.index_dir(model_dir)`)."""
  if read_only:
    return ocp.CheckpointManager(directory, options=run_directory.reader_options(
        enable_async_checkpointing=False,
        multiprocessing_options=run_directory.this_process()))
  return run_directory.settled(ocp.CheckpointManager(
      run_directory.writable(directory),
      options=run_directory.pruning_options(
          max_to_keep=max_to_keep, create=False,
          enable_async_checkpointing=False, cleanup_tmp_directories=True,
          multiprocessing_options=run_directory.every_process())))


def index_metadata(corpus_metadata: dict, embeddings: np.ndarray | Rows,
                   step: int, searcher: str, block_length: int | None = None,
                   params_step: int | None = None) -> dict:
  """`block_length`: wordpieces of each block that were embedded (None: all);
  `params_step`: the trainer step whose towers embedded them (None: `step`)."""
  return {
      'block_length': block_length or corpus_metadata['max_block_length'],
      'step': int(step),
      'params_step': int(step if params_step is None else params_step),
      'corpus_fingerprint': corpus_metadata['corpus_fingerprint'],
      'num_blocks': int(embeddings.shape[0]),
      'dim': int(embeddings.shape[1]),
      'dtype': str(embeddings.dtype),
      'searcher': searcher,
  }


def publish(manager: ocp.CheckpointManager, step: int,
            embeddings: np.ndarray | Rows, metadata: dict,
            scann: ScannSearcher | None = None) -> None:
  """Saves one index as step `step`; visible to readers only once complete.

  Raises StepAlreadyExistsError on every process alike when the step is
  published already (by an index builder beside a trainer, say). One
  writer at a time (`run_guard.PublishLock`): a second one waits, then
  finds the step published.
  """
  with run_guard.PublishLock(manager.directory):
    if distributed.agree(step in run_directory.reload(manager)):
      raise ocp.checkpoint_manager.StepAlreadyExistsError(
          f'Index step {step} is already published in {manager.directory}.')
    rows = embeddings if isinstance(embeddings, Rows) else Rows.of(embeddings)
    items = {run_directory.EMBEDDINGS: EmbeddingsSave(rows),
             run_directory.METADATA: run_directory.JsonSave(metadata)}
    if scann is not None:
      items[run_directory.SCANN] = ScannSave(scann)
    manager.save(step, args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()
  run_directory.empty_trash(manager.directory)


def check_compatible(metadata: dict, corpus_metadata: dict, dim: int,
                     where: str, block_length: int | None = None) -> None:
  """Refuses an index of another corpus, block count, embedding size or block
  cut (`block_length`, None for whole blocks)."""
  problems = []
  full = corpus_metadata['max_block_length']
  if metadata.get('block_length', full) != (block_length or full):
    problems.append(f'blocks cut to {metadata.get("block_length", full)} '
                    f'wordpieces != {block_length or full} here')
  if metadata['corpus_fingerprint'] != corpus_metadata['corpus_fingerprint']:
    changes = corpus_changes.pending_changes(corpus_metadata,
                                             metadata['corpus_fingerprint'])
    problems.append(
        f'corpus fingerprint {metadata["corpus_fingerprint"]} != '
        f'{corpus_metadata["corpus_fingerprint"]} of the corpus' + (
            f', which changed since ({", ".join(c["change"] for c in changes)}'
            '): `realm-jax corpus sync --model_dir=...` brings the index up '
            'to date' if changes else ''))
  if metadata['num_blocks'] != corpus_metadata['num_blocks']:
    problems.append(f'{metadata["num_blocks"]:,} blocks != '
                    f'{corpus_metadata["num_blocks"]:,} in the corpus')
  if metadata['dim'] != dim:
    problems.append(f'embedding dim {metadata["dim"]} != {dim} of the model')
  if problems:
    raise IndexMismatchError(f'Index {where} does not match: '
                             + '; '.join(problems) + '.')


def read_metadata(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The metadata of a published step; None if it was pruned meanwhile."""
  restored = run_directory.restore(manager, step, ocp.args.Composite(**{
      run_directory.METADATA: run_directory.JsonRestore()}))
  return None if restored is None else restored[run_directory.METADATA]


def read_embeddings(manager: ocp.CheckpointManager,
                    step: int) -> np.ndarray | None:
  """[num_blocks, dim] embeddings of a published step; None if it was pruned
  meanwhile."""
  restored = run_directory.restore(manager, step, ocp.args.Composite(**{
      run_directory.EMBEDDINGS: EmbeddingsRestore()}))
  return None if restored is None else restored[run_directory.EMBEDDINGS]


# What every reader of an index's metadata reads.
METADATA_FIELDS = {'corpus_fingerprint': str, 'num_blocks': int, 'dim': int,
                   'searcher': str}


def _check_metadata(metadata, where: str) -> None:
  """Refuses metadata that is not what `index_metadata` writes (garbage
  that still parses as JSON)."""
  wrong = ([f'{name} is not {kind.__name__}' for name, kind in
            METADATA_FIELDS.items() if not isinstance(metadata.get(name), kind)]
           if isinstance(metadata, dict) else ['not a JSON object'])
  if wrong:
    raise errors.DamagedStepError(
        where, os.path.join(where, run_directory.METADATA,
        run_directory.METADATA), '; '.join(wrong))


def load_index(manager: ocp.CheckpointManager, step: int, corpus_metadata: dict,
               dim: int, searcher: str = 'exact', devices=None,
               block_length: int | None = None, search_dtype=None):
  """(searcher, metadata) of a published step, checked against the corpus;
  None if the builder pruned the step meanwhile. `search_dtype`: the exact
  searcher's rows (see `ExactSearcher`)."""
  where = os.path.join(str(manager.directory), str(step))
  metadata = read_metadata(manager, step)
  if metadata is None:
    return None
  _check_metadata(metadata, where)
  check_compatible(metadata, corpus_metadata, dim, where, block_length)
  removed = corpus_changes.removed_ids(corpus_metadata)
  if searcher == 'scann':
    if metadata['searcher'] == 'scann':
      loaded = run_directory.restore(manager, step, ocp.args.Composite(**{
          run_directory.SCANN: ScannRestore()}))
      scann = None if loaded is None else loaded[run_directory.SCANN]
    else:
      embeddings = read_embeddings(manager, step)
      scann = None if embeddings is None else build_scann(embeddings)
    if scann is None:
      return None
    scann.removed = removed
    return scann, metadata
  embeddings = read_embeddings(manager, step)
  if embeddings is None:
    return None
  if embeddings.shape != (metadata['num_blocks'], metadata['dim']):
    raise errors.DamagedStepError(
        where, os.path.join(where, run_directory.EMBEDDINGS, EMBEDDINGS_FILE),
        f'{embeddings.shape} embeddings, the metadata says '
        f'{(metadata["num_blocks"], metadata["dim"])}')
  return ExactSearcher(embeddings, devices=devices, dtype=search_dtype,
                       removed=removed), metadata


def embed_and_publish(index: ocp.CheckpointManager, step: int,
                      embedder: DocumentEmbedder, params, local_arrays,
                      corpus_metadata: dict, searcher: str = 'exact') -> None:
  """Embeds every block with `params` (the retriever's) and publishes `step`."""
  start = time.perf_counter()
  embeddings, docs_per_s = embed_corpus(embedder, params, local_arrays,
                                        corpus_metadata['num_blocks'])
  scann = build_scann(embeddings) if searcher == 'scann' else None
  publish(index, step, embeddings, index_metadata(
      corpus_metadata, embeddings, step, searcher,
      local_arrays['token_ids'].shape[1]), scann)
  log.info('published index step %d: %s blocks in %.1fs (embedding '
               '%s docs/s on %d %s device(s))', step, f'{len(embeddings):,}',
               time.perf_counter() - start, f'{docs_per_s:,.0f}',
               jax.device_count(), jax.devices()[0].platform)
