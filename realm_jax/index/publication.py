"""The hand-over between the trainer and the index builder, through Orbax.

Both jobs share one model_dir:
  model_dir/checkpoints/<step>/   the trainer's checkpoints; the item
                                  `retriever_params` holds the towers.
  model_dir/index/<step>/         the builder's published indexes, `step` being
                                  the trainer step whose parameters embedded
                                  the corpus: items `embeddings` ([N, D]),
                                  `metadata` (JSON) and, for ScaNN, `scann`.
  model_dir/checkpoints/TRAINING_DONE   written by the trainer when it ends.
Orbax writes each step into a temporary directory and renames it when
complete, so a reader never sees a partial index or checkpoint; each writer
prunes its old steps while the other job reads, which `steps` survives.
"""

import dataclasses
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import distributed
from realm_jax.index import steps
from realm_jax.index.exact import ExactSearcher
from realm_jax.index.scann_searcher import ScannSearcher, build_scann

CHECKPOINTS = 'checkpoints'
INDEX = 'index'
RETRIEVER_ITEM = 'retriever_params'
DONE_MARKER = 'TRAINING_DONE'
SEARCHERS = ('exact', 'scann')


class IndexMismatchError(ValueError):
  """A published index that does not belong to this corpus or model."""


def checkpoints_dir(model_dir: str) -> str:
  return os.path.join(model_dir, CHECKPOINTS)


def index_dir(model_dir: str) -> str:
  return os.path.join(model_dir, INDEX)


def mark_training_done(model_dir: str) -> None:
  path = epath.Path(checkpoints_dir(model_dir))
  path.mkdir(parents=True, exist_ok=True)
  (path / DONE_MARKER).write_text('done\n')


def clear_training_done(model_dir: str) -> None:
  (epath.Path(checkpoints_dir(model_dir)) / DONE_MARKER).unlink(missing_ok=True)


def training_done(model_dir: str) -> bool:
  return (epath.Path(checkpoints_dir(model_dir)) / DONE_MARKER).exists()


class ScannHandler(ocp.CheckpointHandler):
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


def trainer_checkpoints(model_dir: str) -> ocp.CheckpointManager:
  """Read-only view of the trainer's checkpoints (`steps.reload` to see new
  ones)."""
  return ocp.CheckpointManager(
      checkpoints_dir(model_dir), options=steps.reader_options(
          multiprocessing_options=every_process()))


def restore_retriever_params(checkpoints: ocp.CheckpointManager, step: int):
  """Only the towers' parameters of a trainer step (not reader or optimizer);
  None if the trainer pruned the step meanwhile."""
  restored = steps.restore(checkpoints, step, ocp.args.Composite(**{
      RETRIEVER_ITEM: ocp.args.StandardRestore()}))
  return None if restored is None else restored[RETRIEVER_ITEM]


def every_process() -> ocp.options.MultiprocessingOptions:
  """All processes, named: Orbax then syncs them through the distributed
  runtime's keyed barriers rather than device collectives, which its
  background save threads and the main thread would interleave. (Orbax
  then leaves creating the directory to us: see `writable`.)"""
  return ocp.options.MultiprocessingOptions(
      active_processes=set(range(jax.process_count())))


def this_process() -> ocp.options.MultiprocessingOptions:
  """This process alone: a reader of indexes that no other process waits
  for (each trainer process refreshes its own searcher when it looks)."""
  return ocp.options.MultiprocessingOptions(
      primary_host=jax.process_index(),
      active_processes={jax.process_index()})


def writable(directory: str) -> str:
  epath.Path(directory).mkdir(parents=True, exist_ok=True)
  return directory


def index_manager(directory: str, read_only: bool = False,
                  max_to_keep: int = 3) -> ocp.CheckpointManager:
  """Orbax manager of an index directory (usually `index_dir(model_dir)`)."""
  if read_only:
    return ocp.CheckpointManager(directory, options=steps.reader_options(
        enable_async_checkpointing=False,
        multiprocessing_options=this_process()))
  return ocp.CheckpointManager(writable(directory), options=steps.pruning_options(
      max_to_keep=max_to_keep, create=False, enable_async_checkpointing=False,
      cleanup_tmp_directories=True, multiprocessing_options=every_process()))


def index_metadata(corpus_metadata: dict, embeddings: np.ndarray, step: int,
                   searcher: str, block_length: int | None = None) -> dict:
  """`block_length`: wordpieces of each block that were embedded (None: all)."""
  return {
      'block_length': block_length or corpus_metadata['max_block_length'],
      'step': int(step),
      'corpus_fingerprint': corpus_metadata['corpus_fingerprint'],
      'num_blocks': int(embeddings.shape[0]),
      'dim': int(embeddings.shape[1]),
      'dtype': str(embeddings.dtype),
      'searcher': searcher,
  }


def publish(manager: ocp.CheckpointManager, step: int, embeddings: np.ndarray,
            metadata: dict, scann: ScannSearcher | None = None) -> None:
  """Saves one index as step `step`; visible to readers only once complete.

  Raises StepAlreadyExistsError on every process alike when the step is
  published already (by an index builder beside a trainer, say).
  """
  if distributed.agree(step in steps.reload(manager)):
    raise ocp.checkpoint_manager.StepAlreadyExistsError(
        f'Index step {step} is already published in {manager.directory}.')
  items = {'embeddings': ocp.args.StandardSave({'embeddings': embeddings}),
           'metadata': ocp.args.JsonSave(metadata)}
  if scann is not None:
    items['scann'] = ScannSave(scann)
  manager.save(step, args=ocp.args.Composite(**items), force=True)
  manager.wait_until_finished()
  steps.empty_trash(manager.directory)


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
    problems.append(f'corpus fingerprint {metadata["corpus_fingerprint"][:12]}'
                    f'... != {corpus_metadata["corpus_fingerprint"][:12]}...')
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
  restored = steps.restore(manager, step, ocp.args.Composite(
      metadata=ocp.args.JsonRestore()))
  return None if restored is None else restored['metadata']


def read_embeddings(manager: ocp.CheckpointManager,
                    step: int) -> np.ndarray | None:
  """[num_blocks, dim] embeddings of a published step; None if it was pruned
  meanwhile."""
  restored = steps.restore(manager, step, ocp.args.Composite(
      embeddings=ocp.args.StandardRestore()))
  return (None if restored is None else
          np.asarray(restored['embeddings']['embeddings']))


def load_index(manager: ocp.CheckpointManager, step: int, corpus_metadata: dict,
               dim: int, searcher: str = 'exact', devices=None,
               block_length: int | None = None):
  """(searcher, metadata) of a published step, checked against the corpus;
  None if the builder pruned the step meanwhile."""
  where = os.path.join(str(manager.directory), str(step))
  metadata = read_metadata(manager, step)
  if metadata is None:
    return None
  check_compatible(metadata, corpus_metadata, dim, where, block_length)
  if searcher == 'scann' and metadata['searcher'] == 'scann':
    loaded = steps.restore(manager, step, ocp.args.Composite(
        scann=ScannRestore()))
    return None if loaded is None else (loaded['scann'], metadata)
  embeddings = read_embeddings(manager, step)
  if embeddings is None:
    return None
  if searcher == 'scann':
    return build_scann(embeddings), metadata
  return ExactSearcher(embeddings, devices=devices), metadata
