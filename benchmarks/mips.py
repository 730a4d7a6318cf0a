"""Maximum inner product search: recall@8 against exact, queries/s at batch 1
and 512, build time and index memory, for every searcher a user might pick.

Searchers, side by side on the same vectors and queries:
  - numpy: brute force (one matmul, argpartition);
  - exact: realm_jax.index.exact.ExactSearcher (chunked JAX matmul + top-k,
    sharded over the devices), on float32 or bfloat16 rows;
  - approx-max-k: the same searcher with `jax.lax.approx_max_k` (recall
    target 0.95) in place of the exact top-k of each chunk (approximate on
    TPU, its default there; XLA:CPU and GPU compute it exactly, by sorting);
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

`sweep` (the accelerator mode of benchmarks/run.py): exact search of 512
queries, top-8, over 13,353,718 x 128 bfloat16 rows generated on the device,
for chunk sizes x selection methods x group sizes
(realm_jax.index.exact.Selection): milliseconds per call against the
bounds, the FLOPs at the device's bf16 peak and the rows' bytes at its
memory bandwidth. On a CPU the same code runs at 200,000 rows.
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


def _approx_max_k(rows):
  """ExactSearcher with `approx_max_k` per chunk: the rows are placed on
  the devices once and passed to the search as an argument."""
  from realm_jax.index.exact import ExactSearcher  # pylint: disable=g-import-not-at-top
  searcher = ExactSearcher(rows, method='approx_max_k', recall_target=0.95)
  return (lambda q: searcher.search(q, K)[1]), searcher.embeddings.nbytes


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


# The accelerator sweep: exact search at the paper's size, every selection.

SWEEP_CPU_ROWS = 200_000
SWEEP_QUICK_ROWS = 50_000


def sweep_selections(platform: str, quick: bool = False) -> list:
  """The selections `sweep` times on `platform`, the likeliest first (a
  sweep cut short by its time budget keeps the ones that matter): the
  platform's default, on accelerators the group maxima in one kernel
  ('fused': the scores never written; its programs each scoring 4 or 16
  groups in turn, their queries loaded once, and 256 queries a program),
  bigger chunks (fewer kernel
  launches; [512 x chunk] float32 scores: 2 GB at 1M rows), group sizes,
  the one-pass `top_k`, small chunks (their scores fit in the L2 cache),
  unrolled scans, the previous defaults and `approx_max_k`."""
  from realm_jax.index.exact import Selection, selection_for  # pylint: disable=g-import-not-at-top
  default = selection_for(platform)
  if quick:
    grid = [default, Selection(16384, 'two_stage', 64),
            Selection(16384, 'top_k'), Selection(16384, 'approx_max_k')]
  elif platform == 'cpu':
    grid = [default, Selection(16384, 'two_stage', 128),
            Selection(32768, 'two_stage', 128),
            Selection(65536, 'two_stage', 64),
            Selection(65536, 'two_stage', 256),
            Selection(16384, 'two_stage', 128, unroll=4),
            Selection(65536, 'top_k'), Selection(16384, 'top_k'),
            Selection(65536, 'approx_max_k')]
  else:
    grid = [default,
            *(Selection(1 << 20, 'fused', 128, program_groups=n)
              for n in (1, 4, 16)),
            Selection(1 << 20, 'fused', 128, program_groups=16,
                      program_queries=256),
            *(Selection(1 << 20, 'fused', g) for g in (256, 64)),
            Selection(1 << 20, 'two_stage', 256),
            Selection(1 << 20, 'two_stage', 128),
            Selection(1 << 19, 'two_stage', 128),
            Selection(1 << 21, 'two_stage', 128),
            *(Selection(1 << 20, 'two_stage', g) for g in (256, 512, 64, 32)),
            *(Selection(1 << 18, 'two_stage', g) for g in (128, 256, 512)),
            Selection(1 << 18, 'top_k'), Selection(1 << 20, 'top_k'),
            Selection(1 << 16, 'two_stage', 128),
            Selection(1 << 16, 'two_stage', 128, unroll=4),
            Selection(1 << 14, 'two_stage', 128),
            Selection(1 << 14, 'two_stage', 128, unroll=8),
            Selection(1 << 18, 'approx_max_k')]
  seen = set()
  return [s for s in grid if not (s in seen or seen.add(s))]


def _group(selection) -> str | int:
  """The table's group: rows per group, and for 'fused' beside it the
  groups and queries a GPU program scores when not the default's ('128, 16
  x 256 a program')."""
  from realm_jax.index.group_maxima import BLOCK_QUERIES  # pylint: disable=g-import-not-at-top
  if selection.method == 'fused' and (
      selection.program_groups, selection.program_queries) != (
          1, BLOCK_QUERIES):
    return (f'{selection.group}, {selection.program_groups} x '
            f'{selection.program_queries} a program')
  return selection.group if selection.method in ('two_stage', 'fused') else ''


def _timed_calls(fn, args, calls: int) -> tuple[float, float, object]:
  """(seconds of the first call, compile included; median seconds of
  `calls` more; the first result). Device arrays, waited for."""
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  first = jax.block_until_ready(fn(*args))
  first_s = time.perf_counter() - start
  jax.block_until_ready(fn(*args))  # Warm-up.
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return first_s, statistics.median(times), first


def sweep(num_rows: int, dim: int = 128, queries: int = BATCH, k: int = K,
          selections=None, calls: int = 5, budget_s: float | None = None,
          quick: bool = False) -> list[dict]:
  """Exact search of `queries` random queries over `num_rows` x `dim`
  bfloat16 random rows, both generated on device 0 (no host transfer), for
  each selection (default `sweep_selections`): ms per call (median of
  `calls` after a warm-up) against the bounds, and the first call's
  seconds (compile included). Each row's ids are compared
  with the first row's (`same_ids`: the fraction equal; exact selections
  agree but for float rounding of near-ties across shapes). The last row
  runs ExactSearcher's sharded program at the default selection. A row
  starts only if the previous one's time still fits in `budget_s` seconds
  (counted from the start, the table's generation included); the rows not
  started say so."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from benchmarks import peak  # pylint: disable=g-import-not-at-top
  from realm_jax.index import exact  # pylint: disable=g-import-not-at-top
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  began = time.perf_counter()
  device = jax.devices()[0]
  platform = target.platform_of([device])
  selections = list(selections or sweep_selections(platform, quick))
  table_key, query_key = jax.random.split(jax.random.PRNGKey(0))
  one = jax.sharding.SingleDeviceSharding(device)
  table = jax.jit(lambda key: jax.random.normal(key, (num_rows, dim),
                                                jnp.bfloat16),
                  out_shardings=one)(table_key)
  query = jax.jit(lambda key: jax.random.normal(key, (queries, dim),
                                                jnp.bfloat16),
                  out_shardings=one)(query_key)
  exclude = jax.device_put(np.full((queries, 1), -1, np.int32), device)
  jax.block_until_ready((table, query))
  flop_rate, flop_source = peak.device_peak(jnp.bfloat16, jnp.float32)
  byte_rate, byte_source = peak.device_bandwidth()
  flops = 2.0 * queries * num_rows * dim
  bound_ms = {'flops': flops / flop_rate * 1e3,
              'rows': table.nbytes / byte_rate * 1e3,
              # Scores written as float32 and read back once: the floor of
              # any form that writes them to memory.
              'scores': 2 * 4 * queries * num_rows / byte_rate * 1e3}
  base = {'benchmark': 'mips_sweep', 'device': device.device_kind,
          'compiler': f'jax {jax.__version__} ({device.platform})',
          'rows': num_rows, 'dim': dim, 'queries': queries, 'k': k,
          'dtype': 'bfloat16', 'bound_ms': max(bound_ms['flops'],
                                               bound_ms['rows']),
          'flops_bound_ms': bound_ms['flops'],
          'read_bound_ms': bound_ms['rows'],
          'scores_round_trip_ms': bound_ms['scores'],
          'peak_source': f'{flop_source}; {byte_source}'}
  rows, reference, needed = [], None, 0.0
  runs = [(s, 'exact_search') for s in selections]
  runs.append((exact.selection_for(platform), 'ExactSearcher (sharded)'))
  for selection, program in runs:
    row = {**base, 'program': program, 'method': selection.method,
           'chunk_size': selection.chunk_size,
           'group': _group(selection), 'unroll': selection.unroll,
           'program_groups': selection.program_groups,
           'program_queries': selection.program_queries}
    if budget_s is not None and (time.perf_counter() - began + needed
                                 > budget_s):
      rows.append({**row, 'skipped': f'time budget of {budget_s:.0f} s '
                                     'spent'})
      print(rows[-1], flush=True)
      continue
    row_began = time.perf_counter()
    try:
      if program == 'exact_search':
        search = lambda q, t, e, s=selection: exact.exact_search(
            q, t, k, exclude_ids=e, selection=s)
        args = (query, table, exclude)
      else:
        mesh = exact.index_mesh([device])
        split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
            exact.AXIS))
        whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        search = exact.sharded_top_k(mesh, num_rows, k, selection=selection)
        args = (jax.device_put(query, whole), jax.device_put(table, split),
                jax.device_put(np.ones(num_rows, bool), split),
                jax.device_put(exclude, whole))
      first_s, seconds, (_, ids) = _timed_calls(search, args, calls)
    except Exception as error:  # pylint: disable=broad-except
      # Out of memory, or a shape the compiler refuses: the next one runs.
      rows.append({**row, 'error': f'{type(error).__name__}: '
                                   f'{str(error)[:300]}'})
      print(rows[-1], flush=True)
      continue
    needed = time.perf_counter() - row_began
    ids = np.asarray(ids)
    if reference is None:
      reference = ids
    rows.append({**row, 'ms': seconds * 1e3,
                 'first_call_s': first_s,
                 'ratio_to_bound': seconds * 1e3 / row['bound_ms'],
                 'tflop_per_s': flops / seconds / 1e12,
                 'same_ids': float(np.mean(ids == reference))})
    print(rows[-1], flush=True)
  return rows


def run_sweep(options) -> list[dict]:
  """`sweep` at the paper's size on an accelerator; 200,000 rows on a CPU
  (50,000 with --quick); in the time `options.time_left()` gives, if any."""
  import jax  # pylint: disable=g-import-not-at-top
  on_cpu = jax.devices()[0].platform == 'cpu'
  quick = getattr(options, 'quick', False)
  num_rows = (SWEEP_QUICK_ROWS if quick else SWEEP_CPU_ROWS) if on_cpu \
      else PAPER_BLOCKS
  time_left = getattr(options, 'time_left', None)
  return sweep(num_rows, calls=3 if on_cpu else 5, quick=quick,
               budget_s=None if time_left is None else max(0.0, time_left()))
