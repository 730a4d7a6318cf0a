"""The trainer's side of the hand-over: the newest published index, swapped in.

The client looks for a newer index at every call (every train step): a
directory listing, cheap beside the step. So an index is swapped in at the
first step after its publication, however long the builder took; how often
indexes come, and how stale they are, is the builder's cadence alone (see
`refresh.run_refresh`). A newer index is loaded whole and checked against this
corpus and model before it is swapped in. Staleness is the trainer step minus
the step of the parameters that embedded the index. An index the builder
prunes while it is listed or loaded is skipped (see `run_directory`): the client keeps
the index it has and looks again. A damaged one (a crash's half-written file,
a missing commit marker) is refused with the file named, set aside, and the
previous good index served instead.

With `lockstep_interval` the schedule is fixed instead: at step s the index of
step I * (floor(s / I) - 1) is served (the first index until step 2I),
waited for, and asked of the builder (`run_directory.request_index`) when it
is missing. Each step's retrieval, so each loss, then depends on nothing but
the run's settings: not on how fast the builder is, nor on kills and resumes.
"""

import logging
import time

import gin
import numpy as np
from etils import epath

from realm_jax import errors, run_directory
from realm_jax.index import publication
from realm_jax.index.exact import ExactSearcher

log = logging.getLogger(__name__)
# How long a lockstep trainer waits for its own background save of the step
# it needs to be listed, before it says that step is not being kept.
SAVE_WAIT_SECONDS = 120.0


@gin.configurable
class IndexClient:
  """Serves `search` from the newest compatible index of a model_dir.

  `search_dtype`: the exact searcher's rows on the devices, e.g.
  'bfloat16' to halve the index's memory (None: as published, float32).
  `lockstep_interval`: the fixed schedule above (None: the newest index);
  the trainer must save a checkpoint or a retriever snapshot at each
  multiple of it.
  """

  def __init__(self, model_dir: str, corpus_metadata: dict, dim: int,
               searcher: str = 'exact', devices=None,
               block_length: int | None = None, follow: bool = True,
               search_dtype: str | None = None,
               lockstep_interval: int | None = None,
               poll_seconds: float = 0.5):
    self.model_dir = model_dir
    self.corpus_metadata = corpus_metadata
    self.dim = dim
    # False: keep the first index for good (fine-tuning's frozen index).
    self.follow = follow
    self.searcher_kind = searcher
    self.devices = devices
    self.block_length = block_length
    self.search_dtype = search_dtype
    if lockstep_interval is not None and lockstep_interval < 1:
      raise ValueError(f'IndexClient.lockstep_interval={lockstep_interval} '
                       'must be at least 1 (or None).')
    self.lockstep_interval, self.poll_seconds = lockstep_interval, poll_seconds
    self.searcher = None
    self.index_step: int | None = None
    self.params_step: int | None = None  # The towers' step that embedded it.
    self.refreshes = 0
    self._listing = None  # Of the index directory, once it exists.
    self._host_embeddings = None

  def newest_step(self) -> int | None:
    published = self._published()
    return published[-1] if published else None

  def _published(self) -> list[int]:
    """The published index steps, sorted."""
    if self._listing is None:
      if not epath.Path(run_directory.index_dir(self.model_dir)).is_dir():
        return []
      self._listing = run_directory.Listing(publication.index_manager(
          run_directory.index_dir(self.model_dir), read_only=True))
    return self._listing.steps()

  def maybe_refresh(self, force: bool = False) -> bool:
    """Swaps in the newest published index if it is newer than ours; True if
    swapped. Without `follow`, only the first index (or a `force`d look)."""
    if not force and not self.follow and self.searcher is not None:
      return False
    while True:  # Each damaged step is set aside: the listing shrinks.
      newest = self.newest_step()
      if newest is None or newest == self.index_step:
        return False
      loaded = self._load(newest)
      if loaded is not None:  # Swapped in, or vanished: look again later.
        return loaded

  def serve(self, step: int) -> None:
    """Swaps in index `step` itself, not the newest, if it is published and
    whole (kept then: see `follow`)."""
    if step != self.index_step and step in self._published():
      self._load(step)

  def refresh_for(self, step: int | None) -> bool:
    """Before retrieving with the parameters of `step` (updates done): the
    lockstep schedule's index, or else `maybe_refresh`."""
    if self.lockstep_interval is None or step is None or not self.follow:
      return self.maybe_refresh()
    wanted = self.lockstep_step(step)
    if wanted == self.index_step:
      return False
    asked_at = None
    while True:
      if wanted in self._published() and self._load(wanted):
        run_directory.clear_index_request(self.model_dir, wanted)
        return True
      if asked_at is None or time.monotonic() - asked_at > 60:
        self._ask_for(wanted, step)
        asked_at = time.monotonic()
      time.sleep(self.poll_seconds)

  def lockstep_step(self, step: int) -> int:
    """The index step the lockstep schedule serves at trainer `step`."""
    interval = self.lockstep_interval
    return max(0, (step // interval - 1) * interval)

  def _ask_for(self, wanted: int, step: int) -> None:
    """Asks the builder for index `wanted` (again, every minute it is still
    missing), once sure that the run keeps that step's towers to embed. The
    trainer's save of that step may still be writing in the background: it
    is waited for up to `SAVE_WAIT_SECONDS`."""
    steps = run_directory.RetrieverSteps(self.model_dir)
    deadline = time.monotonic() + SAVE_WAIT_SECONDS
    while wanted not in steps.reload() and time.monotonic() < deadline:
      time.sleep(self.poll_seconds)
    if wanted not in steps.reload():
      raise RuntimeError(
          f'Step {step} is to retrieve from the index of step {wanted} '
          f'(IndexClient.lockstep_interval={self.lockstep_interval}), but '
          f'{self.model_dir} keeps no checkpoint or retriever snapshot of '
          'it: save one at every multiple of the interval '
          '(train.checkpoint_every or train.retriever_every) and keep 3 '
          '(train.keep_checkpoints).')
    run_directory.request_index(self.model_dir, wanted)
    log.info('step %d waits for index step %d; asked the index builder '
             '(`realm-jax refresh` on %s)', step, wanted, self.model_dir)

  def _load(self, step: int) -> bool | None:
    """Swaps in index `step`: True; False if it vanished meanwhile; None if
    it was damaged (refused, named in the log and set aside)."""
    try:
      loaded = publication.load_index(
          self._listing.manager, step, self.corpus_metadata, self.dim,
          self.searcher_kind, self.devices, self.block_length,
          self.search_dtype)
    except errors.DamagedStepError as error:
      log.error('Refused index step %d: %s', step, error)
      run_directory.set_aside(run_directory.index_dir(self.model_dir), step)
      return None
    if loaded is None:
      return False
    self.searcher, self.index_step = loaded[0], step
    self.params_step = loaded[1].get('params_step', step)
    self.refreshes += 1
    log.info('serving index step %d (embedded by the towers of step %d)',
             step, self.params_step)
    return True

  def staleness(self, step: int) -> int | None:
    """Trainer steps since the towers that embedded the index."""
    return None if self.index_step is None else step - self.params_step

  def search(self, query_embeddings, k: int, exclude_ids=None):
    return self.dispatch(query_embeddings, k, exclude_ids)()

  def dispatch(self, query_embeddings, k: int, exclude_ids=None):
    """`search` in two parts: the device work queued now, the returned
    function waits and gives (scores, ids) (see the searchers' `dispatch`)."""
    if self.searcher is None:
      raise errors.NotFound(f'No index published under '
                            f'{run_directory.index_dir(self.model_dir)} yet.')
    return self.searcher.dispatch(query_embeddings, k, exclude_ids)

  @property
  def keeps_embeddings(self) -> bool:
    """Whether `document_embeddings` can answer: the exact searcher's."""
    return self.searcher_kind == 'exact'

  def document_embeddings(self, ids):
    """[..., D] stored embeddings of block ids (the frozen Embed_doc(z) that
    fine-tuning reads); needs the exact searcher, which holds them."""
    if not isinstance(self.searcher, ExactSearcher):
      raise ValueError('document_embeddings needs IndexClient.searcher = '
                       f"'exact', not {self.searcher_kind!r}.")
    if self._host_embeddings is None or self._host_embeddings[0] != \
        self.index_step:
      self._host_embeddings = (self.index_step, np.asarray(
          self.searcher.embeddings)[:self.searcher.num_docs])
    return self._host_embeddings[1][np.maximum(np.asarray(ids), 0)].astype(
        np.float32)
