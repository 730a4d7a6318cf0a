"""Exact MIPS equals numpy brute force: chunks, shards, ties, exclusions,
for every way of choosing a chunk's top-k (`approx_max_k` is exact on CPU,
which has no approximate kernel for it; TPUs use it approximately)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.index import exact
from realm_jax.index.exact import (ExactSearcher, Selection, exact_search,
                                   selection_for)
from realm_jax.index.group_maxima import triton_tiles
from realm_jax.models import target

pytestmark = pytest.mark.unit


def _brute_force(queries, docs, k, exclude=None):
  scores = (queries.astype(np.float64) @ docs.T.astype(np.float64))
  if exclude is not None:
    for row, ids in enumerate(exclude.reshape(len(queries), -1)):
      scores[row, ids[ids >= 0]] = -np.inf
  ids = np.argsort(-scores, axis=1, kind='stable')[:, :k]  # Ties: lower id.
  return np.take_along_axis(scores, ids, 1), ids


def _data(num_docs, seed=0, ties=False):
  rng = np.random.default_rng(seed)
  if ties:  # Small integers: many exactly equal scores.
    return (rng.integers(-2, 3, (9, 8)).astype(np.float32),
            rng.integers(-2, 3, (num_docs, 8)).astype(np.float32))
  return (rng.standard_normal((9, 16)).astype(np.float32),
          rng.standard_normal((num_docs, 16)).astype(np.float32))


METHODS = pytest.mark.parametrize('method', exact.METHODS)


@METHODS
@pytest.mark.parametrize('num_docs,chunk_size,k', [
    (100, 32, 5),    # Chunks that do not divide N: the tail is a short one.
    (100, 1000, 8),  # One chunk.
    (50, 4, 10),     # k larger than a chunk.
    (3, 2, 3),       # A tail shorter than k.
])
def test_single_device_matches_brute_force(num_docs, chunk_size, k, method):
  queries, docs = _data(num_docs)
  scores, ids = exact_search(queries, docs, k=k, chunk_size=chunk_size,
                             method=method)
  expected_scores, expected_ids = _brute_force(queries, docs, k)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@METHODS
@pytest.mark.parametrize('num_devices', [1, 8])
@pytest.mark.parametrize('ties', [False, True])
def test_sharded_search_with_ties_and_exclusions(num_devices, ties, method):
  queries, docs = _data(203, seed=num_devices, ties=ties)  # 203: uneven shards.
  searcher = ExactSearcher(docs, devices=jax.devices()[:num_devices],
                           chunk_size=10, method=method)
  exclude = np.random.default_rng(1).integers(-1, 203, (9, 2))
  for k, excluded in ((8, None), (8, exclude), (30, exclude[:, 0])):
    scores, ids = searcher.search(queries, k, excluded)
    expected_scores, expected_ids = _brute_force(queries, docs, k, excluded)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@pytest.mark.parametrize('selection', [
    Selection(4096, 'two_stage', group=128),
    Selection(4096, 'two_stage', group=32, unroll=2),
    Selection(8192, 'two_stage', group=256),  # One chunk, then a tail.
    Selection(5000, 'two_stage', group=128),  # A last partial group.
    Selection(20_000, 'two_stage', group=96),  # One chunk of all 10,000.
    Selection(4096, 'top_k'),
    Selection(4096, 'approx_max_k', recall_target=0.9),
    Selection(method='fused', group=128),  # 78 groups, then 16 rows.
    Selection(method='fused', group=80),  # Whole groups only.
], ids=str)
@pytest.mark.parametrize('ties', [False, True])
def test_large_chunks_are_exact_for_every_selection(ties, selection):
  """Chunks of 4,096 rows and more take the two-stage top-k (group maxima
  first) at every group size; ties must still go to the lower id, and
  exclusions and removed rows must still hold, whatever the selection."""
  queries, docs = _data(10_000, seed=5, ties=ties)  # 2 whole chunks + a tail.
  removed = np.random.default_rng(3).choice(10_000, 500, replace=False)
  searcher = ExactSearcher(docs, devices=jax.devices()[:1],
                           selection=selection, removed=removed)
  assert searcher.selection == selection
  exclude = np.random.default_rng(2).integers(-1, 10_000, (9, 3))
  exclude_removed = np.concatenate(
      [exclude, np.broadcast_to(removed, (9, len(removed)))], axis=1)
  for excluded, truth_excluded in ((None, removed[None].repeat(9, 0)),
                                   (exclude, exclude_removed)):
    scores, ids = searcher.search(queries, 8, excluded)
    expected_scores, expected_ids = _brute_force(queries, docs, 8,
                                                 truth_excluded)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@pytest.mark.parametrize('selection', [
    Selection(16384, 'two_stage', group=64),  # One chunk: no other chunk's
    Selection(method='fused', group=64),      # top k makes up for it.
], ids=str)
def test_excluding_each_querys_best_rows_keeps_the_search_exact(selection):
  """REALM excludes a query's own block, which is usually its best row.
  'fused' takes its group maxima before the exclusions, so an excluded row
  can be its group's maximum: the next best rows must still be found."""
  queries, docs = _data(10_000, seed=6)
  searcher = ExactSearcher(docs, devices=jax.devices()[:1],
                           selection=selection)
  best = _brute_force(queries, docs, 5)[1]
  scores, ids = searcher.search(queries, 8, best)
  expected_scores, expected_ids = _brute_force(queries, docs, 8, best)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


def test_every_platform_has_a_default_and_only_tpus_approximate():
  assert selection_for('cpu') == Selection(65536, 'two_stage', group=128)
  # GPUs: the kernel that keeps the scores on chip, in groups it tiles.
  gpu = selection_for('gpu')
  assert gpu.method == 'fused' and triton_tiles(gpu.group, 128, 2)
  tpu = selection_for('tpu')
  assert tpu.method == 'approx_max_k' and not tpu.exact
  assert tpu.recall_target == 0.95
  assert selection_for('cpu').exact and selection_for('gpu').exact
  # An explicit field overrides the platform's default; the rest stays.
  assert selection_for('tpu', method='two_stage') == Selection(
      tpu.chunk_size, 'two_stage', group=128, recall_target=0.95)
  assert selection_for('gpu', method='two_stage', group=512) == Selection(
      gpu.chunk_size, 'two_stage', group=512)
  with pytest.raises(ValueError, match='platform'):
    selection_for('npu')
  with pytest.raises(ValueError, match='method'):
    Selection(method='sort')
  with pytest.raises(ValueError, match='positive'):
    Selection(group=0)
  with pytest.raises(ValueError, match='program_groups=3: a power of two'):
    Selection(method='fused', program_groups=3)
  with pytest.raises(ValueError, match='program_queries=512'):
    Selection(method='fused', program_queries=512)
  with pytest.raises(ValueError, match='not both'):
    ExactSearcher(np.ones((4, 2), np.float32), selection=Selection(),
                  chunk_size=2)


def test_the_default_follows_the_target_and_the_devices(monkeypatch):
  """exact_search takes the platform the program is traced for; the
  searcher, its devices'. On this CPU: the CPU's; traced for a TPU: the
  approximate top-k, and the TPU's kernels ('fused')."""
  assert ExactSearcher(np.ones((4, 2), np.float32)).selection == (
      selection_for('cpu'))
  picked = []
  search = exact._exact_search
  monkeypatch.setattr(exact, '_exact_search', lambda *args: (
      picked.append(args[-2:]), search(*args))[1])
  queries, docs = _data(100)
  exact_search(queries, docs, k=4)
  with target.compiling_for('tpu'):
    _, ids = exact_search(queries, docs, k=4)
  assert picked == [(selection_for('cpu'), 'cpu'),
                    (selection_for('tpu'), 'tpu')]
  np.testing.assert_array_equal(ids, _brute_force(queries, docs, 4)[1])


def test_the_rows_are_never_padded_or_copied():
  """Whole chunks are sliced from the rows in place and the tail scored as
  a shorter chunk: no padded copy of the table (3.4 GB at 13.35M bf16
  rows), nor any other array as large as it."""
  queries, docs = _data(1000)
  jaxpr = jax.make_jaxpr(
      lambda q, d: exact._exact_search(
          q, d, jnp.full((9, 1), -1, jnp.int32), 8, Selection(96), 'cpu'))(
              queries, docs)
  shapes = []

  def walk(jaxpr):
    for equation in jaxpr.eqns:
      shapes.extend(v.aval.shape for v in equation.outvars)
      for param in equation.params.values():
        if hasattr(param, 'jaxpr'):
          walk(param.jaxpr)
  walk(jaxpr.jaxpr)
  assert (96, 16) in shapes  # The chunks, sliced.
  assert all(np.prod(shape) < docs.size for shape in shapes), shapes


def test_eight_shards_equal_one():
  queries, docs = _data(1000, seed=3)
  one = ExactSearcher(docs, devices=jax.devices()[:1]).search(queries, 8)
  eight = ExactSearcher(docs, devices=jax.devices()[:8]).search(queries, 8)
  np.testing.assert_array_equal(one[1], eight[1])
  np.testing.assert_allclose(one[0], eight[0], rtol=1e-6)


def test_k_above_the_document_count_is_an_error():
  with pytest.raises(ValueError, match='k=11'):
    exact_search(np.ones((1, 4), np.float32), np.ones((10, 4), np.float32), k=11)
  with pytest.raises(ValueError, match='k=11'):
    ExactSearcher(np.ones((10, 4), np.float32)).search(np.ones((1, 4)), 11)


def test_bfloat16_rows_halve_the_index_and_keep_exact_results():
  """Small integers are exact in bfloat16, and scores accumulate in float32:
  the same ids and scores as float32 rows, ties included."""
  queries, docs = _data(203, seed=4, ties=True)
  half = ExactSearcher(docs, devices=jax.devices()[:2], chunk_size=10,
                       dtype='bfloat16')
  assert half.embeddings.dtype == jnp.bfloat16
  assert half.embeddings.nbytes * 2 == ExactSearcher(
      docs, devices=jax.devices()[:2], chunk_size=10).embeddings.nbytes
  scores, ids = half.search(queries, 30)
  expected_scores, expected_ids = _brute_force(queries, docs, 30)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_array_equal(scores, expected_scores)
  assert scores.dtype == np.float32
