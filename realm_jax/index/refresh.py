"""The index builder (`realm-jax refresh`): a separate process beside training.

It polls the trainer's checkpoints and retriever snapshots (see
`run_directory.RetrieverSteps`) through read-only Orbax managers; when the
newest step is due (see `due_step`) it restores only the retriever's
parameters, re-embeds every block with the document tower, builds the searcher
and publishes the index under model_dir/index with the trainer step as its
step. The builder alone sets how fresh the trainer's index is: the trainer
swaps in each index at its next step (see `client`). It exits when the
trainer marks training done and the last step is published. A step the
trainer prunes while it is listed or read is skipped (see `run_directory`),
and a step published meanwhile (the trainer's first index, `corpus sync`'s)
is left as it is: neither is fatal. A damaged step (see
`errors.DamagedStepError`) is named in the log and never embedded. A
trainer waiting for one index (`IndexClient.lockstep_interval`) asks for it,
and the builder embeds that step first.
"""

import logging
import os
import time

import gin
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import distributed, errors, run_directory, run_guard
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.index.embed import DocumentEmbedder, local_block_arrays
from realm_jax.models.realm import model_retriever

log = logging.getLogger(__name__)


def due_step(saved: list[int], last: int | None, interval: int,
             training_done: bool = False) -> int | None:
  """The step to embed next: the newest one, once it is `interval`
  steps past the last index (any newer one when training is done, so the
  final parameters get their index); None if none is due."""
  if not saved or (last is not None and saved[-1] <= last):
    return None
  if last is None or training_done or saved[-1] >= last + interval:
    return saved[-1]
  return None


class IndexBuilder:
  """One poll at a time of the builder's loop (see `run_refresh`)."""

  def __init__(self, model_dir: str, corpus: OpenCorpus,
               searcher: str = 'exact',
               batch_size: int = 64, max_to_keep: int = 3,
               block_length: int | None = None, interval: int = 1):
    self.model_dir, self.searcher, self.interval = model_dir, searcher, interval
    self.corpus_metadata = corpus.metadata
    self.arrays = local_block_arrays(corpus, block_length)
    self.embedder = DocumentEmbedder(model_retriever(), batch_size)
    self.index = publication.index_manager(
        run_directory.index_dir(model_dir), max_to_keep=max_to_keep)
    self.steps = run_directory.RetrieverSteps(model_dir)
    self.last = self.index.latest_step()
    self.published = 0
    self.damaged = set()  # (step, directory identity) of refused steps.

  def _identity(self, step: int):
    """A step and which directory holds it (its inode, on a local disk): a
    damaged one set aside and saved again whole is a new one."""
    where = self.steps.where(step)
    if '://' in where:
      return step, None
    try:
      return step, os.stat(where).st_ino
    except FileNotFoundError:
      return step, None

  def _advance(self, step: int) -> None:
    """`step` is published: the cadence counts from the newest index."""
    self.last = step if self.last is None else max(self.last, step)

  def poll(self) -> str:
    """'published' a due step, 'waiting' for one, or training is 'done'."""
    # Read before the listing: a step saved after it must still be embedded.
    done = run_directory.training_done(self.model_dir)
    saved = self.steps.reload()
    indexes = run_directory.reload(self.index)  # A trainer may have published first.
    if indexes:
      self._advance(indexes[-1])
    saved = [s for s in saved if self._identity(s) not in self.damaged]
    requested = run_directory.requested_index(self.model_dir)
    if requested in saved and requested not in indexes:
      step = requested  # A trainer waits for exactly this one.
    else:
      step = due_step(saved, self.last, self.interval, done)
    # Embedding and publishing are collective: process 0's view decides.
    due = distributed.agree(-1 if step is None else step)
    if due >= 0:
      try:
        params = self.steps.restore(due)
        damaged = False
      except errors.DamagedStepError as error:
        log.error('Not embedding step %d: %s', due, error)
        params, damaged = None, True
      if not distributed.everyone(not damaged):
        self.damaged.add(self._identity(due))
        return 'waiting'
      if not distributed.everyone(params is not None):
        return 'waiting'
      try:
        publication.embed_and_publish(self.index, due, self.embedder, params,
                                      self.arrays, self.corpus_metadata,
                                      self.searcher)
      except ocp.checkpoint_manager.StepAlreadyExistsError:
        # Published meanwhile: the trainer's first index, or `corpus sync`.
        log.info('index step %d was published meanwhile; kept', due)
        self._advance(due)
        return 'waiting'
      self._advance(due)
      self.published += 1
      return 'published'
    return 'done' if distributed.agree(done) else 'waiting'


@gin.configurable
def run_refresh(model_dir: str, corpus_dir: str, searcher: str = 'exact',
                poll_seconds: float = 2.0, batch_size: int = 64,
                max_to_keep: int = 3, block_length: int | None = None,
                refresh_interval_steps: int = 1, stale_factor: int = 1) -> int:
  """Refreshes until training is done; returns the number of publishes.

  `block_length` cuts every block as the trainer's `Pretrain.block_length`
  does (the trainer refuses an index embedded with another cut). The cadence:
  a checkpoint or retriever snapshot is embedded once it is
  `refresh_interval_steps` x `stale_factor` steps past the last index (the paper re-embeds about every
  500 steps; a stale_factor of 30 is its stale-MIPS ablation), and the
  newest one always when training is done.
  """
  if refresh_interval_steps < 1 or stale_factor < 1:
    raise errors.BadConfig(
        f'refresh_interval_steps={refresh_interval_steps} and '
        f'stale_factor={stale_factor} must be at least 1.')
  if poll_seconds <= 0:
    raise errors.BadConfig(f'poll_seconds={poll_seconds} must be above 0.')
  if batch_size < 1:
    raise errors.BadConfig(f'batch_size={batch_size} must be at least 1.')
  if searcher not in publication.SEARCHERS:
    raise errors.BadConfig(f'searcher={searcher!r}; expected one of '
                           f'{publication.SEARCHERS}.')
  corpus = OpenCorpus(corpus_dir)  # A missing corpus: refused, not awaited.
  distributed.initialize()
  with run_guard.BuilderLock(model_dir):
    return _refresh_until_done(model_dir, corpus, searcher, poll_seconds,
                               batch_size, max_to_keep, block_length,
                               refresh_interval_steps * stale_factor)


def _refresh_until_done(model_dir, corpus, searcher, poll_seconds,
                        batch_size, max_to_keep, block_length,
                        interval) -> int:
  checkpoints = epath.Path(run_directory.checkpoints_dir(model_dir))
  if not checkpoints.is_dir():  # Said once: a mistyped model_dir waits too.
    log.info('index builder: waiting for a trainer to write checkpoints in '
             '%s', model_dir)
  while not checkpoints.is_dir():
    time.sleep(poll_seconds)
  builder = IndexBuilder(model_dir, corpus, searcher, batch_size,
                         max_to_keep, block_length, interval)
  log.info('index builder: %s blocks, polling %s (last index step %s), '
           'embedding a step every %d steps',
           f'{builder.corpus_metadata["num_blocks"]:,}', model_dir, builder.last,
           builder.interval)
  while True:
    polled = builder.poll()
    if polled == 'done':
      log.info('training done; index builder exits after %d refreshes',
               builder.published)
      return builder.published
    if polled == 'waiting':
      time.sleep(poll_seconds)
