"""Exact maximum inner product search in JAX, sharded over the devices.

The document embeddings are split row-wise over a 1-D device mesh. Each device
scores its rows one chunk at a time, keeping a running top-k, so memory is
[queries x chunk_size], never [queries x N]; the per-device top-k lists are
then gathered and merged. Ties go to the lower document id, as a stable sort
would order them. Excluded ids (the trivial candidate) score -inf, and so do
rows that are not live (blocks removed from the corpus).

How each chunk's top-k is chosen, and the chunk size, depend on the
platform (`Selection`, DEFAULT_SELECTION): exact everywhere but on TPUs,
whose default is their native approximate top-k (`lax.approx_max_k` at
recall 0.95 per chunk); an explicit selection overrides it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from realm_jax.index.group_maxima import (BLOCK_QUERIES, check_program,
                                          group_maxima, precision_for)
from realm_jax.models import target

AXIS = 'index'

# How each chunk's top-k is chosen:
#   'two_stage': `lax.top_k` of the group maxima, then of the scores of the
#     k best groups (exact; `_two_stage_top_k`);
#   'top_k': `lax.top_k` over the whole chunk (exact);
#   'approx_max_k': `lax.approx_max_k` at `recall_target`: approximate on
#     TPUs, which have a kernel for it. Elsewhere XLA computes it exactly by
#     sorting, which is slow (73.5 ms against 24.7 for 'two_stage' over
#     13.35M rows on an H200), so the defaults pick it on TPUs only;
#   'fused': the two stages over the whole table at once (no chunks), the
#     group maxima from one kernel that never writes the scores
#     (realm_jax.index.group_maxima; the XLA form on CPUs and for groups
#     the kernels do not take), the best groups' rows then scored again
#     (exact; the queries rounded to the rows' dtype first).
METHODS = ('two_stage', 'top_k', 'approx_max_k', 'fused')


@dataclasses.dataclass(frozen=True)
class Selection:
  """How the rows are scanned: `chunk_size` rows scored at a time per device
  ([queries x chunk_size] float32 scores live at once), and how each
  chunk's top-k is chosen (`method`, one of METHODS; `group`: rows per
  group of 'two_stage' and 'fused'; `recall_target`: 'approx_max_k''s);
  `unroll`: chunks per iteration of the scan. 'fused' has no chunks: it
  scores the whole table at once without writing the scores; its GPU
  kernel's program scores `program_queries` queries against
  `program_groups` groups in turn, the queries loaded once for them
  (`group_maxima.check_program`)."""
  chunk_size: int = 65536
  method: str = 'two_stage'
  group: int = 128
  recall_target: float = 0.95
  unroll: int = 1
  program_groups: int = 1
  program_queries: int = BLOCK_QUERIES

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f'selection method {self.method!r}; expected one of '
                       f'{METHODS}.')
    if self.chunk_size < 1 or self.group < 1 or self.unroll < 1:
      raise ValueError(f'{self}: chunk_size, group and unroll must be '
                       'positive.')
    if not 0 < self.recall_target <= 1:
      raise ValueError(f'{self}: recall_target must be in (0, 1].')
    check_program(self.program_queries, self.program_groups, self.group)

  @property
  def exact(self) -> bool:
    """Whether it is exact on every platform ('approx_max_k' is exact only
    outside TPUs)."""
    return self.method != 'approx_max_k'


# Per platform ('cpu', 'gpu', 'tpu'; realm_jax.models.target):
#   - CPU: chunks of 65,536 and the two-stage top-k (on a 2-core Xeon it
#     made the search 2x faster; on a contended 2-core AMD EPYC the methods
#     were within 10% of each other and chunks of 16,384-32,768 ran 10-15%
#     faster: docs/benchmarks.md, "What bounds the search").
#   - GPU: 'fused' in groups of 128: the scores never reach memory, so
#     the search is no longer bound by writing them (on one H100, 13.35M
#     bf16 rows and 512 queries: 6.69 ms, 3.8x the compute bound, against
#     25.3 ms for the best chunked form, chunks of 1,048,576 in groups of
#     256, whose scores' round trip alone is 16.3 ms; groups of 256: 8.18
#     ms, of 64: 8.53; docs/benchmarks.md, "What bounds the search").
#     Shapes the Triton kernel does not tile take the XLA form of the same
#     two stages, as on CPUs.
#     `python -m benchmarks.run --accelerator` sweeps the choices.
#   - TPU: `approx_max_k`, its native approximate top-k, at recall 0.95.
DEFAULT_SELECTION = {
    'cpu': Selection(chunk_size=65536, method='two_stage', group=128),
    'gpu': Selection(chunk_size=1048576, method='fused', group=128),
    'tpu': Selection(chunk_size=65536, method='approx_max_k',
                     recall_target=0.95),
}


def selection_for(platform: str, chunk_size: int | None = None,
                  method: str | None = None, group: int | None = None,
                  recall_target: float | None = None,
                  unroll: int | None = None,
                  program_groups: int | None = None,
                  program_queries: int | None = None) -> Selection:
  """`platform`'s default selection, with the fields given overridden."""
  if platform not in DEFAULT_SELECTION:
    raise ValueError(f'platform {platform!r}; expected one of '
                     f'{tuple(DEFAULT_SELECTION)}.')
  given = {'chunk_size': chunk_size, 'method': method, 'group': group,
           'recall_target': recall_target, 'unroll': unroll,
           'program_groups': program_groups,
           'program_queries': program_queries}
  return dataclasses.replace(
      DEFAULT_SELECTION[platform],
      **{name: value for name, value in given.items() if value is not None})


def _resolve(selection: Selection | None, platform: str, **fields):
  if selection is not None:
    if any(value is not None for value in fields.values()):
      raise ValueError('Give a Selection or its fields, not both.')
    return selection
  return selection_for(platform, **fields)


def _two_stage_top_k(scores, k: int, group: int, valid):
  """`lax.top_k` of [Q, n] scores where `valid(positions)` (positions
  [Q, m] -> bool; `valid()`: all n in order) holds, -inf elsewhere,
  exactly, in two cheaper stages.

  The top k lie in the k groups (of `group` consecutive scores) with the
  highest maxima, so a top-k over n / group group maxima and one over the
  k x group scores of those groups replace one over all n: on CPU the
  top-k then costs a tenth of the matmul instead of as much again. The
  mask is applied inside each stage, not to a masked copy of the scores:
  the maxima read the scores once, the second stage gathers k x group of
  them. The groups are kept in id order, so ties still go to the lower id.
  A last partial group is filled with -inf after every real score (a real
  score of -inf still goes first).
  """
  queries, n = scores.shape
  everywhere = valid()
  if n % group:
    scores = jnp.pad(scores, ((0, 0), (0, -n % group)),
                     constant_values=-jnp.inf)
    everywhere = jnp.pad(everywhere, ((0, 0), (0, -n % group)))
  masked = jnp.where(everywhere, scores, -jnp.inf)
  _, best = jax.lax.top_k(masked.reshape(queries, -1, group).max(axis=-1), k)
  best = jnp.sort(best, axis=1)
  positions = (best[:, :, None] * group + jnp.arange(group, dtype=jnp.int32)
               ).reshape(queries, k * group)
  candidates = jnp.where(valid(positions),
                         jnp.take_along_axis(scores, positions, axis=1),
                         -jnp.inf)
  values, pick = jax.lax.top_k(candidates, k)
  return values, jnp.take_along_axis(positions, pick, axis=1)


def _chunk_top_k(scores, k: int, selection: Selection, valid):
  """(values, positions) [Q, k] of [Q, n] scores where `valid` (see
  `_two_stage_top_k`) holds, -inf elsewhere, by `selection.method`."""
  n = scores.shape[1]
  if selection.method == 'two_stage' and n >= 4 * k * selection.group:
    return _two_stage_top_k(scores, k, selection.group, valid)
  scores = jnp.where(valid(), scores, -jnp.inf)
  if selection.method == 'approx_max_k':
    return jax.lax.approx_max_k(scores, k,
                                recall_target=selection.recall_target)
  return jax.lax.top_k(scores, k)


def _fused_top_k_of_rows(queries, rows, live, first_id, num_docs,
                         exclude_ids, k: int, selection: Selection,
                         platform: str):
  """The two-stage top-k over every row at once, its first stage one
  kernel (`group_maxima`, in the selection's groups and programs) that
  reads `rows` in place and keeps the scores on chip: no chunks, so the
  rows are never sliced.

  The maxima are over the rows that may be returned (live, real ids) but
  not the per-query exclusions: each excluded id can lift one group's
  maximum above the group's best valid score, so the k + E best groups
  (E: exclusions a query) hold the top k. Their rows, and the last
  partial group's, are scored again at the kernel's precision (its
  float32 sums may differ from these in the last bits, which can only
  matter where two groups' maxima are that close at the last group taken).
  """
  num_rows, group = rows.shape[0], selection.group
  groups, tail = divmod(num_rows, group)
  ids = first_id + jnp.arange(num_rows, dtype=jnp.int32)
  usable = live & (ids < num_docs)
  positions = [jnp.broadcast_to(
      jnp.arange(groups * group, num_rows, dtype=jnp.int32),
      (queries.shape[0], tail))]
  if groups:
    maxima = group_maxima(queries, rows, jnp.where(usable, 0.0, -jnp.inf),
                          group, platform,
                          program_queries=selection.program_queries,
                          program_groups=selection.program_groups)
    _, best = jax.lax.top_k(maxima, min(k + exclude_ids.shape[1], groups))
    best = jnp.sort(best, axis=1)  # Id order: ties go to the lower id.
    positions.insert(0, (best[:, :, None] * group + jnp.arange(
        group, dtype=jnp.int32)).reshape(queries.shape[0], -1))
  positions = jnp.concatenate(positions, axis=1)
  candidate_ids = first_id + positions
  valid = jnp.take(usable, positions) & ~jnp.any(
      candidate_ids[..., None] == exclude_ids[:, None, :], axis=-1)
  products = jnp.einsum('qd,qmd->qm', queries, jnp.take(rows, positions, axis=0),
                        preferred_element_type=jnp.float32,
                        precision=precision_for(rows.dtype))
  values, pick = jax.lax.top_k(jnp.where(valid, products, -jnp.inf), k)
  return values, jnp.take_along_axis(candidate_ids, pick, axis=1)


def _top_k_of_rows(queries, rows, live, first_id, num_docs, exclude_ids,
                   k: int, selection: Selection, platform: str):
  """Running top-k over `rows` (ids first_id...) whose `live` [N] is True,
  chunk by chunk ('fused': all at once, by `platform`'s kernel).

  The whole chunks are sliced from `rows` in place, and the rows after the
  last whole chunk are scored as shorter chunks: the rows are never padded
  or copied (a padded copy of 13.35M bf16 rows is 3.4 GB written per
  search). For the two-stage top-k every chunk but the last few rows is
  whole groups: padding the scores to whole groups costs XLA:CPU as much as
  a one-pass top-k.
  """
  if selection.method == 'fused':
    return _fused_top_k_of_rows(queries.astype(rows.dtype), rows, live,
                                first_id, num_docs, exclude_ids, k,
                                selection, platform)
  num_rows = rows.shape[0]
  group = selection.group if selection.method == 'two_stage' else 1
  chunk_size = min(selection.chunk_size, num_rows)
  if chunk_size == num_rows and num_rows > group:
    chunk_size -= num_rows % group
  whole, tail = divmod(num_rows, chunk_size)

  def score(best, start, size):
    chunk = jax.lax.dynamic_slice_in_dim(rows, start, size)
    chunk_live = jax.lax.dynamic_slice_in_dim(live, start, size)

    def valid(positions=None):
      """[Q or 1, m] positions in the chunk (None: all, in order) -> bool."""
      if positions is None:
        positions, live_there = jnp.arange(size, dtype=jnp.int32)[None, :], \
            chunk_live[None, :]
      else:
        live_there = jnp.take(chunk_live, positions, mode='fill',
                              fill_value=False)
      ids = first_id + start + positions
      return live_there & (ids < num_docs) & ~jnp.any(
          ids[..., None] == exclude_ids[:, None, :], axis=-1)

    scores = jnp.einsum('qd,nd->qn', queries, chunk,
                        preferred_element_type=jnp.float32)
    scores, top = _chunk_top_k(scores, min(k, size), selection, valid)
    # Earlier (lower-id) candidates come first, so top_k keeps them on ties.
    all_scores = jnp.concatenate([best[0], scores], axis=1)
    all_ids = jnp.concatenate([best[1], first_id + start + top], axis=1)
    merged, pick = jax.lax.top_k(all_scores, k)
    return merged, jnp.take_along_axis(all_ids, pick, axis=1)

  best = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32),
          jnp.full((queries.shape[0], k), -1, jnp.int32))
  starts = jnp.arange(whole, dtype=jnp.int32) * chunk_size
  best, _ = jax.lax.scan(
      lambda best, start: (score(best, start, chunk_size), None), best,
      starts, unroll=min(selection.unroll, whole))
  start = whole * chunk_size
  for size in (tail - tail % group, tail % group):  # Whole groups, the rest.
    if size:
      best = score(best, start, size)
      start += size
  return best


@functools.partial(jax.jit,
                   static_argnames=('k', 'selection', 'platform'))
def _exact_search(queries, embeddings, exclude_ids, k: int,
                  selection: Selection, platform: str):
  num_docs = embeddings.shape[0]
  return _top_k_of_rows(queries, embeddings, jnp.ones(num_docs, bool), 0,
                        num_docs, exclude_ids, k, selection, platform)


def exact_search(queries, embeddings, k: int, exclude_ids=None,
                 chunk_size: int | None = None, method: str | None = None,
                 group: int | None = None, recall_target: float | None = None,
                 selection: Selection | None = None):
  """Top-k inner products on one device: (scores [Q, k], ids [Q, k]).

  The selection (`selection`, or its fields) defaults to the target
  platform's (DEFAULT_SELECTION).
  """
  num_docs = embeddings.shape[0]
  if not 0 < k <= num_docs:
    raise ValueError(f'k={k} must be in [1, {num_docs}] (the document count).')
  platform = target.target_platform()
  selection = _resolve(selection, platform, chunk_size=chunk_size,
                       method=method, group=group, recall_target=recall_target)
  if exclude_ids is None:
    exclude_ids = jnp.full((queries.shape[0], 1), -1, jnp.int32)
  return _exact_search(queries, embeddings, jnp.asarray(exclude_ids, jnp.int32),
                       k, selection, platform)


def index_mesh(devices) -> jax.sharding.Mesh:
  """The 1-D mesh the embeddings are split over, row-wise."""
  return jax.make_mesh((len(devices),), (AXIS,),
                       (jax.sharding.AxisType.Explicit,), devices=devices)


def sharded_top_k(mesh, num_docs: int, k: int, chunk_size: int | None = None,
                  method: str | None = None, group: int | None = None,
                  recall_target: float | None = None,
                  selection: Selection | None = None):
  """jit(queries [Q, D], rows [N', D] and live [N'] split over `mesh`,
  exclude_ids [Q, E]) -> (scores, ids) [Q, k]: every device's running top-k,
  gathered, merged. The selection (`selection`, or its fields) defaults to
  that of the mesh's platform (DEFAULT_SELECTION)."""
  platform = target.platform_of(mesh.devices)
  selection = _resolve(selection, platform, chunk_size=chunk_size,
                       method=method, group=group, recall_target=recall_target)

  def shard_top_k(queries, rows, live, exclude_ids):
    first_id = jax.lax.axis_index(AXIS) * rows.shape[0]
    scores, ids = _top_k_of_rows(queries, rows, live, first_id, num_docs,
                                 exclude_ids, min(k, rows.shape[0]),
                                 selection, platform)
    # [shards, Q, k] in shard order: lower ids first, for stable ties.
    scores = jax.lax.all_gather(scores, AXIS, axis=1, tiled=True)
    ids = jax.lax.all_gather(ids, AXIS, axis=1, tiled=True)
    merged, pick = jax.lax.top_k(scores, k)
    return merged, jnp.take_along_axis(ids, pick, axis=1)

  return jax.jit(jax.shard_map(
      shard_top_k, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P()),
      out_specs=(P(), P()), check_vma=False))


class ExactSearcher:
  """Exact MIPS over embeddings sharded row-wise across `devices`.

  `dtype`: the rows' dtype on the devices (None: the embeddings'). bfloat16
  halves their memory (13,353,718 x 128: 3.4 GB instead of 6.8); scores
  still accumulate in float32. `removed`: ids never returned (blocks
  removed from the corpus). `chunk_size`, `method`, `group`,
  `recall_target` or a whole `selection`: how the rows are scanned
  (`Selection`); what is not given is the devices' platform's default.
  """

  def __init__(self, embeddings, devices=None, chunk_size: int | None = None,
               dtype=None, removed=(), method: str | None = None,
               group: int | None = None, recall_target: float | None = None,
               selection: Selection | None = None):
    devices = list(devices if devices is not None else jax.devices())
    self.num_docs, self.dim = embeddings.shape
    self.mesh = index_mesh(devices)
    self.selection = _resolve(selection, target.platform_of(devices),
                              chunk_size=chunk_size, method=method,
                              group=group, recall_target=recall_target)
    # Equal shards; a shard's last partial chunk is scored as a shorter one.
    rows_per_shard = -(-self.num_docs // len(devices))
    padded = np.zeros((rows_per_shard * len(devices), self.dim),
                      jnp.dtype(dtype or np.asarray(embeddings).dtype))
    padded[:self.num_docs] = np.asarray(embeddings)
    rows = NamedSharding(self.mesh, P(AXIS))
    self.embeddings = jax.device_put(padded, rows)
    live = np.ones(len(padded), bool)
    live[np.asarray(removed, np.int64)] = False
    self.live = jax.device_put(live, rows)
    self._search = {}

  def _searcher(self, k: int):
    if k not in self._search:
      self._search[k] = sharded_top_k(self.mesh, self.num_docs, k,
                                      selection=self.selection)
    return self._search[k]

  def search(self, query_embeddings, k: int, exclude_ids=None):
    """(scores [Q, k] float32, ids [Q, k] int32) as numpy, best first.

    exclude_ids: [Q] or [Q, E] ids never to return (e.g. the query's own
    block); negative entries exclude nothing.
    """
    return self.dispatch(query_embeddings, k, exclude_ids)()

  def dispatch(self, query_embeddings, k: int, exclude_ids=None):
    """`search`, queued on the devices now; the returned function waits for
    it and gives its numpy result. On an accelerator's in-order stream, a
    search queued before a train step runs before it."""
    if not 0 < k <= self.num_docs:
      raise ValueError(f'k={k} must be in [1, {self.num_docs}].')
    queries = np.asarray(query_embeddings, self.embeddings.dtype)
    exclude = np.full((len(queries), 1), -1, np.int32) if exclude_ids is None \
        else np.asarray(exclude_ids, np.int32).reshape(len(queries), -1)
    replicated = NamedSharding(self.mesh, P())
    scores, ids = self._searcher(k)(jax.device_put(queries, replicated),
                                    self.embeddings, self.live,
                                    jax.device_put(exclude, replicated))
    return lambda: (np.asarray(scores), np.asarray(ids))
