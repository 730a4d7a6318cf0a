"""The trainer's side of the hand-over: the newest published index, swapped in.

The client looks for a newer index at every call (every train step): a
directory listing, cheap beside the step. So an index is swapped in at the
first step after its publication, however long the builder took; how often
indexes come, and how stale they are, is the builder's cadence alone (see
`refresh.run_refresh`). A newer index is loaded whole and checked against this
corpus and model before it is swapped in. Staleness is the trainer step minus
the step of the parameters that embedded the index. An index the builder
prunes while it is listed or loaded is skipped (see `run_directory`): the client keeps
the index it has and looks again.
"""


import gin
import numpy as np
from etils import epath

from realm_jax import run_directory
from realm_jax.index import publication
from realm_jax.index.exact import ExactSearcher


@gin.configurable
class IndexClient:
  """Serves `search` from the newest compatible index of a model_dir.

  `search_dtype`: the exact searcher's rows on the devices, e.g.
  'bfloat16' to halve the index's memory (None: as published, float32).
  """

  def __init__(self, model_dir: str, corpus_metadata: dict, dim: int,
               searcher: str = 'exact', devices=None,
               block_length: int | None = None, follow: bool = True,
               search_dtype: str | None = None):
    self.model_dir = model_dir
    self.corpus_metadata = corpus_metadata
    self.dim = dim
    # False: keep the first index for good (fine-tuning's frozen index).
    self.follow = follow
    self.searcher_kind = searcher
    self.devices = devices
    self.block_length = block_length
    self.search_dtype = search_dtype
    self.searcher = None
    self.index_step: int | None = None
    self.params_step: int | None = None  # The towers' step that embedded it.
    self.refreshes = 0
    self._manager = None
    self._host_embeddings = None

  def _newest_step(self) -> int | None:
    if self._manager is None:
      if not epath.Path(run_directory.index_dir(self.model_dir)).is_dir():
        return None
      self._manager = publication.index_manager(
          run_directory.index_dir(self.model_dir), read_only=True)
    published = run_directory.reload(self._manager)
    return published[-1] if published else None

  def maybe_refresh(self, force: bool = False) -> bool:
    """Swaps in the newest published index if it is newer than ours; True if
    swapped. Without `follow`, only the first index (or a `force`d look)."""
    if not force and not self.follow and self.searcher is not None:
      return False
    newest = self._newest_step()
    if newest is None or newest == self.index_step:
      return False
    loaded = publication.load_index(
        self._manager, newest, self.corpus_metadata, self.dim,
        self.searcher_kind, self.devices, self.block_length,
        self.search_dtype)
    if loaded is None:
      return False
    self.searcher, self.index_step = loaded[0], newest
    self.params_step = loaded[1].get('params_step', newest)
    self.refreshes += 1
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
      raise RuntimeError(f'No index published under '
                         f'{run_directory.index_dir(self.model_dir)} yet.')
    return self.searcher.dispatch(query_embeddings, k, exclude_ids)

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
