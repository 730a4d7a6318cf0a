"""Exact MIPS equals numpy brute force: chunks, shards, ties, exclusions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.index.exact import ExactSearcher, exact_search

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


@pytest.mark.parametrize('num_docs,chunk_size,k', [
    (100, 32, 5),    # Chunks that do not divide N: padding must never win.
    (100, 1000, 8),  # One chunk.
    (50, 4, 10),     # k larger than a chunk.
])
def test_single_device_matches_brute_force(num_docs, chunk_size, k):
  queries, docs = _data(num_docs)
  scores, ids = exact_search(queries, docs, k=k, chunk_size=chunk_size)
  expected_scores, expected_ids = _brute_force(queries, docs, k)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@pytest.mark.parametrize('num_devices', [1, 8])
@pytest.mark.parametrize('ties', [False, True])
def test_sharded_search_with_ties_and_exclusions(num_devices, ties):
  queries, docs = _data(203, seed=num_devices, ties=ties)  # 203: uneven shards.
  searcher = ExactSearcher(docs, devices=jax.devices()[:num_devices],
                           chunk_size=10)
  exclude = np.random.default_rng(1).integers(-1, 203, (9, 2))
  for k, excluded in ((8, None), (8, exclude), (30, exclude[:, 0])):
    scores, ids = searcher.search(queries, k, excluded)
    expected_scores, expected_ids = _brute_force(queries, docs, k, excluded)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@pytest.mark.parametrize('ties', [False, True])
def test_two_stage_top_k_of_large_chunks_is_exact(ties):
  """Chunks of 4,096 rows take the two-stage top-k (group maxima first);
  ties must still go to the lower id, exclusions must still hold."""
  queries, docs = _data(10_000, seed=5, ties=ties)  # Pads to 3 whole chunks.
  searcher = ExactSearcher(docs, devices=jax.devices()[:1], chunk_size=4096)
  exclude = np.random.default_rng(2).integers(-1, 10_000, (9, 3))
  for excluded in (None, exclude):
    scores, ids = searcher.search(queries, 8, excluded)
    expected_scores, expected_ids = _brute_force(queries, docs, 8, excluded)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


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
