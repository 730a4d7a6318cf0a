"""The index builder (`realm-jax refresh`): a separate process beside training.

It is configured by the run: the towers as the trainer's config.gin builds
them, and the corpus, block cut and cadence the trainer recorded in
run.json (see `run_refresh`). It polls the trainer's checkpoints and
retriever snapshots (see `run_directory.RetrieverSteps`) through read-only
Orbax managers; when the newest step is due (see `due_step`) it restores
only the retriever's parameters, re-embeds every block with the document
tower, builds the searcher and publishes the index under model_dir/index
with the trainer step as its step. The builder alone sets how fresh the
trainer's index is, at the cadence the trainer was given: the trainer swaps
in each index at its next step (see `client`). It exits when the
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
from typing import Callable

import gin
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import distributed, errors, run_directory, run_guard
from realm_jax.data import corpus_changes
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.index.embed import DocumentEmbedder, local_block_arrays
from realm_jax.models.realm import model_retriever
from realm_jax.models.retriever import Retriever

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
               block_length: int | None = None, interval: int = 1,
               retriever: Retriever | None = None):
    self.model_dir, self.searcher, self.interval = model_dir, searcher, interval
    self.corpus_metadata = corpus.metadata
    self.corpus_directory, self.block_length = corpus.directory, block_length
    self.arrays = local_block_arrays(corpus, block_length)
    self.embedder = DocumentEmbedder(retriever or model_retriever(),
                                     batch_size)
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


# The builder's cadence where neither the run nor a binding gives one.
CADENCE_DEFAULTS = {'refresh_interval_steps': 1, 'stale_factor': 1}


@gin.configurable
def run_refresh(model_dir: str, corpus_dir: str | None = None,
                searcher: str = 'exact', poll_seconds: float = 2.0,
                batch_size: int = 64, max_to_keep: int = 3,
                block_length: int | None = None,
                refresh_interval_steps: int | None = None,
                stale_factor: int | None = None,
                retriever: Callable[[], Retriever] | None = None) -> int:
  """Refreshes until training is done; returns the number of publishes.

  What it embeds is the run's: its trainer records in model_dir/run.json
  (`run_directory.RECORD`) the corpus, the block length it reads (the
  trainer refuses an index embedded with another cut) and the cadence it
  was given, and the builder waits for that record and config.gin;
  `retriever` then builds the towers (the command line: as config.gin
  says). The cadence: a checkpoint or retriever snapshot is embedded once
  it is `refresh_interval_steps` x `stale_factor` steps past the last index
  (the paper re-embeds about every 500 steps; a stale_factor of 30 is its
  stale-MIPS ablation), and the newest one always when training is done.

  Given a `corpus_dir` (the way before runs recorded these), the builder
  waits for checkpoints alone and `retriever` (default: `model_retriever`)
  builds the towers as gin is configured; the corpus, `block_length` and
  cadence given must then agree with the run's record where it has one,
  and stand alone for a run without (defaults: whole blocks, every step).
  """
  for name, value in (('refresh_interval_steps', refresh_interval_steps),
                      ('stale_factor', stale_factor)):
    if value is not None and value < 1:
      raise errors.BadConfig(f'{name}={value} must be at least 1.')
  if poll_seconds <= 0:
    raise errors.BadConfig(f'poll_seconds={poll_seconds} must be above 0.')
  if batch_size < 1:
    raise errors.BadConfig(f'batch_size={batch_size} must be at least 1.')
  if searcher not in publication.SEARCHERS:
    raise errors.BadConfig(f'searcher={searcher!r}; expected one of '
                           f'{publication.SEARCHERS}.')
  # A missing corpus: refused, not awaited.
  corpus = None if corpus_dir is None else OpenCorpus(corpus_dir)
  given = {'block_length': block_length,
           'refresh_interval_steps': refresh_interval_steps,
           'stale_factor': stale_factor}
  distributed.initialize()
  with run_guard.BuilderLock(model_dir):
    record = (_await_record(model_dir, poll_seconds) if corpus is None
              else None)
    _await_checkpoints(model_dir, poll_seconds)
    if corpus is not None:  # Written before a trainer's first checkpoint.
      record = run_directory.read_record(model_dir)
    corpus, settings = _settings(model_dir, record, corpus, given)
    builder = IndexBuilder(
        model_dir, corpus, searcher, batch_size, max_to_keep,
        settings['block_length'], settings['refresh_interval_steps'] *
        settings['stale_factor'], (retriever or model_retriever)())
    return _refresh_until_done(builder, poll_seconds)


def _await_checkpoints(model_dir: str, poll_seconds: float) -> None:
  checkpoints = epath.Path(run_directory.checkpoints_dir(model_dir))
  if not checkpoints.is_dir():  # Said once: a mistyped model_dir waits too.
    log.info('index builder: waiting for a trainer to write checkpoints in '
             '%s', model_dir)
  while not checkpoints.is_dir():
    time.sleep(poll_seconds)


def _await_record(model_dir: str, poll_seconds: float) -> dict:
  """The run's record, once its trainer has written it and config.gin (a
  trainer writes the record as it starts, config.gin before its first
  step). Refuses a finished run without one: trained before runs recorded
  it, nothing will write it."""
  said = False
  while True:
    record = run_directory.read_record(model_dir)
    configured = run_directory.config_path(model_dir).exists()
    if record is not None and configured:
      return record
    if (record is None and configured
        and run_directory.training_done(model_dir)):
      raise errors.NotFound(
          f'{model_dir} has no {run_directory.RECORD}: its trainer ran '
          'before runs recorded their corpus, block length and cadence; give '
          "the builder the trainer's: --corpus_dir, --gin_file (the model), "
          '--gin.run_refresh.block_length and '
          '--gin.run_refresh.refresh_interval_steps.')
    if not said:  # Once: a mistyped model_dir waits too.
      log.info('index builder: waiting for a trainer to record the run in '
               '%s (%s, %s)', model_dir, run_directory.RECORD,
               run_directory.CONFIG)
      said = True
    time.sleep(poll_seconds)


def _settings(model_dir: str, record: dict | None, corpus: OpenCorpus | None,
              given: dict) -> tuple[OpenCorpus, dict]:
  """The corpus and the settings (block_length, refresh_interval_steps,
  stale_factor) the builder embeds with: the run's `record`'s, and what is
  `given` (None: not given) refused unless it agrees; without a record
  (a run from before runs recorded one), what is given."""
  defaults = {'block_length': None, **CADENCE_DEFAULTS}
  if record is None:
    log.warning('%s has no %s (its trainer ran before runs recorded one): '
                'the builder embeds with the settings it was given alone.',
                model_dir, run_directory.RECORD)
    return corpus, {name: defaults[name] if value is None else value
                    for name, value in given.items()}
  recorded = {'block_length': record.get('block_length'),
              **record.get('refresh', {})}
  recorded = {name: defaults[name] if recorded.get(name) is None
              else recorded[name] for name in defaults}
  where = run_directory.record_path(model_dir)
  for name, value in given.items():
    if value is not None and value != recorded[name]:
      raise errors.BadConfig(
          f'run_refresh.{name}={value} is bound for the builder, but {where} '
          f'says the run was trained with {recorded[name]}: bind it for the '
          'trainer, which records it, not for the builder.')
  kept = record['corpus']
  if corpus is None:
    corpus = OpenCorpus(kept['dir'])
  if kept.get('fingerprint') and corpus_changes.pending_changes(
      corpus.metadata, kept['fingerprint']) is None:
    raise errors.BadConfig(
        f'The corpus at {corpus.directory} (fingerprint '
        f'{corpus.fingerprint[:16]}) is not the one {model_dir} was trained '
        f'on: {kept["name"]} at {kept["dir"]} (fingerprint '
        f'{kept["fingerprint"][:16]}, {where}).')
  return corpus, recorded


def _refresh_until_done(builder: IndexBuilder, poll_seconds: float) -> int:
  log.info('index builder: %s blocks of %s (cut to %s), polling %s (last '
           'index step %s), embedding a step every %d steps',
           f'{builder.corpus_metadata["num_blocks"]:,}',
           builder.corpus_directory, builder.block_length or 'whole blocks',
           builder.model_dir, builder.last, builder.interval)
  while True:
    polled = builder.poll()
    if polled == 'done':
      log.info('training done; index builder exits after %d refreshes',
               builder.published)
      return builder.published
    if polled == 'waiting':
      time.sleep(poll_seconds)
