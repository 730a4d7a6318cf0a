"""ScaNN maximum inner product search, for CPU hosts and serving.

The default configuration is asymmetric hashing (2 dimensions per 4-bit
code) over every document, then exact re-scoring of the best `reorder`
candidates: recall@8 above 0.99 even on unstructured random vectors, where
tree partitioning loses neighbours. Set `num_leaves` for a partitioned index
on large corpora (num_leaves ~ sqrt(N)) and check recall with the benchmark.
Excluded ids are honoured by over-fetching and filtering.
"""

import os
import pathlib
import re
import tempfile

import gin
import numpy as np
from etils import epath

from realm_jax import extras

_MIN_DOCS_FOR_HASHING = 2_048  # Below this, k-means codebooks are not worth it.


class ScannSearcher:
  """`search(query_embeddings, k, exclude_ids)` over a built ScaNN index."""

  def __init__(self, searcher, num_docs: int):
    self._searcher, self.num_docs = searcher, num_docs
    # Ids never returned: blocks removed from the corpus.
    self.removed = np.zeros(0, np.int64)

  def dispatch(self, query_embeddings, k: int, exclude_ids=None):
    """`search` to run later: ScaNN searches on the host, so all of it is in
    the returned function (which a train loop runs while the device steps)."""
    return lambda: self.search(query_embeddings, k, exclude_ids)

  def search(self, query_embeddings, k: int, exclude_ids=None):
    """(scores [Q, k] float32, ids [Q, k] int32), best first."""
    if not 0 < k <= self.num_docs:
      raise ValueError(f'k={k} must be in [1, {self.num_docs}].')
    queries = np.asarray(query_embeddings, np.float32)
    exclude = (np.full((len(queries), 0), -1, np.int64) if exclude_ids is None
               else np.asarray(exclude_ids).reshape(len(queries), -1))
    fetch = min(k + exclude.shape[1] + len(self.removed), self.num_docs)
    ids, scores = self._searcher.search_batched(queries,
                                                final_num_neighbors=fetch)
    ids = np.asarray(ids, np.int64)
    scores = np.asarray(scores, np.float32)
    keep = ~np.any(ids[:, :, None] == exclude[:, None, :], axis=-1) & (
        ids >= 0) & ~np.isin(ids, self.removed)
    # Stable: kept neighbours stay in ScaNN's order, best first.
    order = np.argsort(~keep, axis=1, kind='stable')[:, :k]
    ids = np.take_along_axis(ids, order, 1)
    scores = np.take_along_axis(scores, order, 1)
    missing = ~np.take_along_axis(keep, order, 1)
    return (np.where(missing, -np.inf, scores).astype(np.float32),
            np.where(missing, -1, ids).astype(np.int32))

  def serialize(self, directory: str) -> None:
    """ScaNN writes local files only; a gs:// directory gets copies."""
    with tempfile.TemporaryDirectory() as local:
      self._searcher.serialize(local)
      target = epath.Path(directory)
      target.mkdir(parents=True, exist_ok=True)
      for file in pathlib.Path(local).iterdir():
        (target / file.name).write_bytes(file.read_bytes())
      (target / 'num_docs').write_text(str(self.num_docs))

  @classmethod
  def load(cls, directory: str) -> 'ScannSearcher':
    """Loads a serialized index, wherever its directory has moved since.

    ScaNN records absolute asset paths, which a checkpoint's final rename
    invalidates; they are re-pointed into a local copy of `directory`
    (ScaNN reads local files only).
    """
    extras.require('scann', f'The ScaNN index in {directory}',
                   'build the run\'s index with --searcher=exact')
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
    source = epath.Path(directory)
    num_docs = int((source / 'num_docs').read_text())
    with tempfile.TemporaryDirectory() as local:
      for file in source.iterdir():
        (pathlib.Path(local) / file.name).write_bytes(file.read_bytes())
      moved = lambda m: os.path.join(local, os.path.basename(m.group(1)))
      assets = re.sub(r'asset_path: "([^"]*)"',
                      lambda m: f'asset_path: "{moved(m)}"',
                      (source / 'scann_assets.pbtxt').read_text())
      numpy_searcher = scann_ops_pybind.scann_pybind.ScannNumpy(local, assets)
    return cls(scann_ops_pybind.ScannSearcher(numpy_searcher), num_docs)


@gin.configurable
def build_scann(embeddings, num_leaves: int = 0, num_leaves_to_search: int = 0,
                dims_per_block: int = 2, reorder: int = 1000,
                max_k: int = 64) -> ScannSearcher:
  """Builds the index (see the module docstring for the parameters)."""
  scann = extras.require('scann', 'A ScaNN index', 'use --searcher=exact')
  embeddings = np.asarray(embeddings, np.float32)
  num_docs = len(embeddings)
  builder = scann.scann_ops_pybind.builder(embeddings, max_k, 'dot_product')
  if num_docs < _MIN_DOCS_FOR_HASHING:
    builder = builder.score_brute_force(quantize=False)
  else:
    if num_leaves:
      builder = builder.tree(
          num_leaves=num_leaves,
          num_leaves_to_search=num_leaves_to_search or max(1, num_leaves // 10),
          training_sample_size=min(num_docs, 250_000))
    builder = builder.score_ah(
        dims_per_block, anisotropic_quantization_threshold=0.2).reorder(
            min(reorder, num_docs))
  return ScannSearcher(builder.build(), num_docs)
