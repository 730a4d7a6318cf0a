"""ScaNN: recall against exact search, exclusions, serialization."""

import numpy as np
import pytest

from realm_jax.index.exact import exact_search
from realm_jax.index.scann_searcher import ScannSearcher, build_scann


def _recall(found, exact):
  return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact)])


@pytest.mark.slow
def test_recall_at_8_on_100k_random_vectors():
  rng = np.random.default_rng(0)
  docs = rng.standard_normal((100_000, 128)).astype(np.float32)
  queries = rng.standard_normal((200, 128)).astype(np.float32)
  _, exact = exact_search(queries, docs, k=8)
  _, found = build_scann(docs).search(queries, 8)
  recall = _recall(found, np.asarray(exact))
  print(f'ScaNN recall@8 on 100k random 128-d vectors: {recall:.4f}')
  assert recall >= 0.95


def test_exclusions_and_serialization(tmp_path):
  rng = np.random.default_rng(1)
  docs = rng.standard_normal((3_000, 32)).astype(np.float32)
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  queries = docs[:20] * 3  # Each query's best match is its own document.
  searcher = build_scann(docs)
  _, ids = searcher.search(queries, 8)
  np.testing.assert_array_equal(ids[:, 0], np.arange(20))
  _, ids = searcher.search(queries, 8, exclude_ids=np.arange(20))
  assert not np.any(ids == np.arange(20)[:, None])
  _, exact = exact_search(queries, docs, k=8, exclude_ids=np.arange(20)[:, None])
  assert _recall(ids, np.asarray(exact)) >= 0.95
  searcher.serialize(str(tmp_path / 'scann'))
  loaded = ScannSearcher.load(str(tmp_path / 'scann'))
  np.testing.assert_array_equal(loaded.search(queries, 8)[1],
                                searcher.search(queries, 8)[1])


def test_small_corpora_are_searched_exactly():
  rng = np.random.default_rng(2)
  docs = rng.standard_normal((100, 16)).astype(np.float32)
  queries = rng.standard_normal((5, 16)).astype(np.float32)
  scores, ids = build_scann(docs).search(queries, 100)
  exact_scores, exact_ids = exact_search(queries, docs, k=100)
  np.testing.assert_array_equal(ids, exact_ids)
  np.testing.assert_allclose(scores, exact_scores, atol=1e-5)
