"""Maximum inner product search: recall@8 against exact, queries/s at batch 1
and 512, build time and index memory, for every searcher a user might pick.

Searchers, side by side on the same vectors and queries:
  - numpy: brute force (one matmul, argpartition), the ground truth;
  - exact: realm_jax.index.exact.ExactSearcher (chunked JAX matmul + top-k,
    sharded over the devices);
  - scann: realm_jax.index.scann_searcher.build_scann's default;
  - faiss-flat / faiss-ivfpq: faiss-cpu's flat inner-product index and an
    IVF-PQ fast-scan index, when faiss-cpu is installed (skipped, and said
    so, when it is not).
The vectors are synthetic Gaussian (the hardest case for quantization: no
structure), float32; queries are drawn the same way.
"""

import pathlib
import statistics
import tempfile
import time

import numpy as np

K = 8
BATCH = 512
SINGLE_QUERIES = 50  # Batch-1 calls timed; the median is reported.


def numpy_top_k(queries, rows, k: int = K):
  scores = queries @ rows.T
  top = np.argpartition(-scores, k, axis=1)[:, :k]
  order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1)
  return np.take_along_axis(top, order, 1)


def recall(found, truth) -> float:
  """Mean fraction of the true top-k found (order ignored)."""
  return float(np.mean([len(set(f) & set(t)) / len(t)
                        for f, t in zip(found, truth)]))


def _numpy(rows):
  return (lambda q: numpy_top_k(q, rows)), rows.nbytes


def _exact(rows):
  from realm_jax.index.exact import ExactSearcher  # pylint: disable=g-import-not-at-top
  searcher = ExactSearcher(rows)
  return (lambda q: searcher.search(q, K)[1]), searcher.embeddings.nbytes


def _scann(rows):
  from realm_jax.index.scann_searcher import build_scann  # pylint: disable=g-import-not-at-top
  searcher = build_scann(rows)
  with tempfile.TemporaryDirectory() as directory:  # Its serialized size.
    searcher.serialize(directory)
    memory = sum(f.stat().st_size for f in pathlib.Path(directory).iterdir())
  return (lambda q: searcher.search(q, K)[1]), memory


def _faiss_flat(rows):
  import faiss  # pylint: disable=g-import-not-at-top
  index = faiss.IndexFlatIP(rows.shape[1])
  index.add(rows)
  return (lambda q: index.search(q, K)[1]), faiss.serialize_index(index).nbytes


def _faiss_ivfpq(rows):
  import faiss  # pylint: disable=g-import-not-at-top
  lists = max(1, int(np.sqrt(len(rows))))
  index = faiss.index_factory(rows.shape[1], f'IVF{lists},PQ64x4fs,RFlat',
                              faiss.METRIC_INNER_PRODUCT)
  index.train(rows[:min(len(rows), 100 * lists)])
  index.add(rows)
  space = faiss.ParameterSpace()  # Lists probed; candidates re-scored exactly.
  space.set_index_parameter(index, 'nprobe', max(1, lists // 8))
  space.set_index_parameter(index, 'k_factor_rf', 32)
  return (lambda q: index.search(q, K)[1]), faiss.serialize_index(index).nbytes


SEARCHERS = {'numpy': _numpy, 'exact': _exact, 'scann': _scann,
             'faiss-flat': _faiss_flat, 'faiss-ivfpq': _faiss_ivfpq}


def _seconds(fn, *args) -> float:
  start = time.perf_counter()
  fn(*args)
  return time.perf_counter() - start


def run(quick: bool) -> list[dict]:
  """One row per (size, searcher)."""
  sizes = (100_000,) if quick else (1_000_000,)
  rng = np.random.default_rng(0)
  rows_out = []
  for size in sizes:
    rows = rng.standard_normal((size, 128), np.float32)
    queries = rng.standard_normal((BATCH, 128), np.float32)
    truth = numpy_top_k(queries, rows)
    for name, build in SEARCHERS.items():
      row = {'benchmark': 'mips', 'vectors': size, 'dim': 128,
             'dtype': 'float32', 'searcher': name}
      try:
        start = time.perf_counter()
        search, memory = build(rows)
        row['build_seconds'] = time.perf_counter() - start
      except ImportError as error:
        rows_out.append({**row, 'skipped': f'{error.name} not installed'})
        continue
      search(queries[:1])  # Compile / warm up.
      search(queries)
      batch_seconds = statistics.median(
          _seconds(search, queries) for _ in range(3))
      single = statistics.median(
          _seconds(search, queries[i:i + 1]) for i in range(SINGLE_QUERIES))
      rows_out.append({
          **row, 'recall_at_8': recall(search(queries), truth),
          'qps_batch_512': BATCH / batch_seconds, 'qps_batch_1': 1 / single,
          'index_bytes': int(memory)})
  return rows_out
