"""Maximum inner product search: recall@8 against exact, queries/s at batch 1
and 512, build time and index memory, for every searcher a user might pick.

Searchers, side by side on the same vectors and queries:
  - numpy: brute force (one matmul, argpartition);
  - exact: realm_jax.index.exact.ExactSearcher (chunked JAX matmul + top-k,
    sharded over the devices), on float32 or bfloat16 rows;
  - approx-max-k: the same matmul, chunk by chunk, with
    `jax.lax.approx_max_k` (recall target 0.95) in place of the exact top-k
    (approximate on TPU; XLA:CPU and GPU may compute it exactly);
  - scann: realm_jax.index.scann_searcher.build_scann's default (asymmetric
    hashing over every row, exact re-scoring of 1,000), and scann-tree, the
    same behind a k-means tree of sqrt(N) leaves searching a tenth of them;
  - faiss-flat / faiss-ivfpq / faiss-bf16: faiss-cpu's flat inner-product
    index, an IVF-PQ fast-scan index with exact re-scoring, and a flat index
    stored as bfloat16, when faiss-cpu is installed (skipped, and said so,
    when it is not).
Datasets: synthetic Gaussian vectors (the hardest case for quantization and
partitioning: no structure) at 1M and (`--paper_scale`) the paper's
13,353,718 rows, and 1M vectors around 1,000 centres (structure, as real
embeddings have), stored as float32 or bfloat16; and the real corpus
embeddings of a published index
(`--index_dir`, default the demo's pre-training index), queried with 512 of
its own rows (each finds itself first). Recall is against float32 brute
force, so the bfloat16 rows show what the storage costs.
"""

import gc
import os
import pathlib
import statistics
import tempfile
import time

import ml_dtypes
import numpy as np

K = 8
BATCH = 512
PAPER_BLOCKS = 13_353_718
DEMO_INDEX = os.path.join('runs', 'demo', 'pretrain', 'index')


def numpy_top_k(queries, rows, k: int = K, chunk: int = 1 << 17):
  """Exact top-k ids by brute force, `chunk` rows at a time (each chunk's
  top-k, then a merge: memory stays a few [queries x chunk] arrays)."""
  best_scores = np.full((len(queries), 0), -np.inf, np.float32)
  best_ids = np.zeros((len(queries), 0), np.int64)
  for start in range(0, len(rows), chunk):
    scores = queries @ rows[start:start + chunk].T
    top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
    scores = np.concatenate(
        [best_scores, np.take_along_axis(scores, top, 1)], axis=1)
    ids = np.concatenate([best_ids, top + start], axis=1)
    keep = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
    best_scores = np.take_along_axis(scores, keep, 1)
    best_ids = np.take_along_axis(ids, keep, 1)
  order = np.argsort(-best_scores, axis=1)
  return np.take_along_axis(best_ids, order, 1)


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


def _approx_max_k(rows, chunk: int = 1 << 20):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  chunk = min(chunk, len(rows))
  padding = -len(rows) % chunk
  table = jnp.asarray(np.pad(rows, ((0, padding), (0, 0)))).reshape(
      -1, chunk, rows.shape[1])
  starts = jnp.arange(table.shape[0]) * chunk

  @jax.jit
  def search(queries):
    queries = queries.astype(table.dtype)

    def one(chunk_and_start):
      block, start = chunk_and_start
      scores = jnp.einsum('qd,nd->qn', queries, block,
                          preferred_element_type=jnp.float32)
      ids = start + jnp.arange(chunk)
      scores = jnp.where(ids < len(rows), scores, -jnp.inf)
      values, top = jax.lax.approx_max_k(scores, K, recall_target=0.95)
      return values, top + start
    values, ids = jax.lax.map(one, (table, starts))
    values = jnp.moveaxis(values, 0, 1).reshape(len(queries), -1)
    ids = jnp.moveaxis(ids, 0, 1).reshape(len(queries), -1)
    _, best = jax.lax.top_k(values, K)
    return jnp.take_along_axis(ids, best, axis=1)
  return (lambda q: np.asarray(search(q))), table.nbytes


def _scann(rows, **tree):
  from realm_jax.index.scann_searcher import build_scann  # pylint: disable=g-import-not-at-top
  searcher = build_scann(rows, **tree)
  with tempfile.TemporaryDirectory() as directory:  # Its serialized size.
    searcher.serialize(directory)
    memory = sum(f.stat().st_size for f in pathlib.Path(directory).iterdir())
  return (lambda q: searcher.search(q, K)[1]), memory


def _scann_tree(rows):
  leaves = int(np.sqrt(len(rows)))
  return _scann(rows, num_leaves=leaves,
                num_leaves_to_search=max(1, leaves // 10))


def _faiss(rows, factory: str, **parameters):
  import faiss  # pylint: disable=g-import-not-at-top
  index = faiss.index_factory(rows.shape[1], factory,
                              faiss.METRIC_INNER_PRODUCT)
  if not index.is_trained:
    index.train(rows[:min(len(rows), 256 * 1024)])
  index.add(rows)
  space = faiss.ParameterSpace()
  for name, value in parameters.items():
    space.set_index_parameter(index, name, value)
  return (lambda q: index.search(q, K)[1]), faiss.serialize_index(index).nbytes


def _faiss_ivfpq(rows):
  lists = max(1, int(np.sqrt(len(rows))))
  # Lists probed, then 32 x k candidates re-scored exactly.
  return _faiss(rows, f'IVF{lists},PQ64x4fs,RFlat', nprobe=max(1, lists // 8),
                k_factor_rf=32)


# At 13.35M rows on 2 cores and 24 GB: flat scans of 3 to 9 minutes a run
# (40-70 queries/s at batch 512 over 1M rows), a tree build of as long, and
# an IVF-PQ build that ran out of memory.
PAPER_SCALE_SKIPPED = {
    'faiss-flat': 'too slow on 2 cores: see its 1M rows (40 q/s at batch 512)',
    'faiss-bf16': 'too slow on 2 cores: see its 1M rows (70 q/s at batch 512)',
    'scann-tree': 'build too slow on 2 cores; see its 1M rows',
    'faiss-ivfpq': 'out of memory in 24 GB (the rows, the index and its '
                   're-scoring copy); see its 1M rows',
}
FLOAT32 = {'numpy': _numpy, 'exact': _exact, 'scann': _scann,
           'scann-tree': _scann_tree,
           'faiss-flat': lambda rows: _faiss(rows, 'Flat'),
           'faiss-ivfpq': _faiss_ivfpq}
BFLOAT16 = {'exact': lambda rows: _exact(rows.astype(ml_dtypes.bfloat16)),
            'approx-max-k': lambda rows: _approx_max_k(
                rows.astype(ml_dtypes.bfloat16)),
            'faiss-bf16': lambda rows: _faiss(rows, 'SQbf16')}


def _seconds(fn, *args) -> float:
  start = time.perf_counter()
  fn(*args)
  return time.perf_counter() - start


def _measure(row: dict, build, rows, queries, truth, single_calls: int,
             repeats: int):
  try:
    start = time.perf_counter()
    search, memory = build(rows)
    row['build_seconds'] = time.perf_counter() - start
  except ImportError as error:
    return {**row, 'skipped': f'{error.name} not installed'}
  search(queries[:1])  # Compile / warm up both shapes.
  found = search(queries)
  batch_seconds = statistics.median(_seconds(search, queries)
                                    for _ in range(repeats))
  single = statistics.median(
      _seconds(search, queries[i:i + 1]) for i in range(single_calls))
  return {**row, 'recall_at_8': recall(found, truth),
          'qps_batch_512': BATCH / batch_seconds, 'qps_batch_1': 1 / single,
          'index_bytes': int(memory)}


def _dataset(name: str, rows, queries, single_calls: int = 50,
             repeats: int = 3, skip: dict | None = None) -> list[dict]:
  """Every searcher on `rows` (float32), in float32 and in bfloat16, but
  those in `skip` ({searcher: why}). Above 1M rows numpy's row is its
  ground-truth pass alone (one batch)."""
  skip = skip or {}
  base = {'benchmark': 'mips', 'dataset': name, 'vectors': len(rows),
          'dim': rows.shape[1]}
  start = time.perf_counter()
  truth = numpy_top_k(queries, rows)
  seconds = time.perf_counter() - start
  results = []
  for dtype, searchers in (('float32', FLOAT32), ('bfloat16', BFLOAT16)):
    for searcher, build in searchers.items():
      row = {**base, 'dtype': dtype, 'searcher': searcher}
      if searcher in skip:
        results.append({**row, 'skipped': skip[searcher]})
      elif searcher == 'numpy' and len(rows) > 1_000_000:
        results.append({**row, 'build_seconds': 0.0, 'recall_at_8': 1.0,
                        'qps_batch_512': BATCH / seconds,
                        'index_bytes': rows.nbytes})
      else:
        results.append(_measure(row, build, rows, queries, truth,
                                single_calls, repeats))
      print(results[-1], flush=True)
      gc.collect()  # One index in memory at a time (13.35M rows: 6.8 GB).
  return results


def clustered(rng, size: int, clusters: int = 1000, spread: float = 0.5):
  """Vectors around `clusters` Gaussian centres: structure that real
  embeddings have and that partitioning exploits."""
  centres = rng.standard_normal((clusters, 128), np.float32)
  return (centres[rng.integers(0, clusters, size)]
          + spread * rng.standard_normal((size, 128), np.float32))


def _published_embeddings(index_dir: str):
  from realm_jax import run_directory  # pylint: disable=g-import-not-at-top
  from realm_jax.index import publication  # pylint: disable=g-import-not-at-top
  manager = publication.index_manager(os.path.abspath(index_dir),
                                      read_only=True)
  step, embeddings = run_directory.newest(
      manager, lambda step: publication.read_embeddings(manager, step))
  if step is None:
    raise FileNotFoundError(f'No published index in {index_dir}.')
  return embeddings


# A smoke run's rows: past ScaNN's brute-force fallback, a few seconds each.
QUICK_ROWS = 30_000

def run(options) -> list[dict]:
  """One row per (dataset, dtype, searcher)."""
  rng = np.random.default_rng(0)
  if options.quick:
    return _dataset('gaussian',
                    rng.standard_normal((QUICK_ROWS, 128), np.float32),
                    rng.standard_normal((BATCH, 128), np.float32))
  results = _dataset('gaussian',
                     rng.standard_normal((1_000_000, 128), np.float32),
                     rng.standard_normal((BATCH, 128), np.float32))
  rows = clustered(rng, 1_000_000 + BATCH)
  results += _dataset('clustered', rows[BATCH:], rows[:BATCH])
  del rows
  if options.paper_scale:
    results += _dataset(
        'gaussian', rng.standard_normal((PAPER_BLOCKS, 128), np.float32),
        rng.standard_normal((BATCH, 128), np.float32), single_calls=10,
        repeats=1, skip=PAPER_SCALE_SKIPPED)
  if not os.path.isdir(options.index_dir):
    return results + [{'benchmark': 'mips', 'dataset': 'corpus',
                       'skipped': f'no published index in {options.index_dir}'
                                  ' (run `make demo` or pass --index_dir)'}]
  rows = _published_embeddings(options.index_dir).astype(np.float32)
  queries = rows[rng.choice(len(rows), BATCH, replace=False)]
  return results + _dataset(f'corpus ({options.index_dir})', rows, queries)
