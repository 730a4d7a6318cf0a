"""Chunked exact MIPS equals brute force."""

import numpy as np
import pytest

from realm_jax.index.exact import exact_search


@pytest.mark.parametrize('num_docs,chunk_size,k', [
    (100, 32, 5),    # Chunks that do not divide N: padding must never win.
    (100, 1000, 8),  # One chunk.
    (50, 4, 10),     # k larger than a chunk.
])
def test_matches_brute_force(num_docs, chunk_size, k):
  rng = np.random.default_rng(num_docs + k)
  queries = rng.standard_normal((7, 16)).astype(np.float32)
  docs = rng.standard_normal((num_docs, 16)).astype(np.float32)
  scores, ids = exact_search(queries, docs, k=k, chunk_size=chunk_size)
  full = queries @ docs.T
  expected_ids = np.argsort(-full, axis=1)[:, :k]
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(scores, np.take_along_axis(full, expected_ids, 1),
                             rtol=1e-5)


def test_k_above_the_document_count_is_an_error():
  with pytest.raises(ValueError, match='k=11'):
    exact_search(np.ones((1, 4), np.float32), np.ones((10, 4), np.float32), k=11)
