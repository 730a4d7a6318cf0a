"""Exact maximum inner product search: chunked matmul plus a running top-k.

Scores are computed one chunk of documents at a time and merged into the
running top-k, so memory is [queries x chunk_size], never [queries x N].
"""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, static_argnames=('k', 'chunk_size'))
def exact_search(queries, embeddings, k: int, chunk_size: int = 65536):
  """Top-k inner products of each query over all document embeddings.

  Args:
    queries: [Q, D] query embeddings.
    embeddings: [N, D] document embeddings (N >= k).
    k: neighbours per query.
    chunk_size: documents scored at once.

  Returns:
    (scores [Q, k] float32, ids [Q, k] int32), best first.
  """
  num_docs, dim = embeddings.shape
  if not 0 < k <= num_docs:
    raise ValueError(f'k={k} must be in [1, {num_docs}] (the document count).')
  chunk_size = min(chunk_size, num_docs)
  num_chunks = -(-num_docs // chunk_size)
  padded = jnp.pad(embeddings, ((0, num_chunks * chunk_size - num_docs), (0, 0)))
  chunks = padded.reshape(num_chunks, chunk_size, dim)
  chunk_k = min(k, chunk_size)

  def merge(best, chunk_and_start):
    chunk, start = chunk_and_start
    scores = jnp.einsum('qd,nd->qn', queries, chunk,
                        preferred_element_type=jnp.float32)
    ids = start + jnp.arange(chunk_size, dtype=jnp.int32)
    scores = jnp.where(ids < num_docs, scores, -jnp.inf)
    scores, top = jax.lax.top_k(scores, chunk_k)
    all_scores = jnp.concatenate([best[0], scores], axis=1)
    all_ids = jnp.concatenate([best[1], ids[top]], axis=1)
    merged, pick = jax.lax.top_k(all_scores, k)
    return (merged, jnp.take_along_axis(all_ids, pick, axis=1)), None

  init = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32),
          jnp.full((queries.shape[0], k), -1, jnp.int32))
  starts = jnp.arange(num_chunks, dtype=jnp.int32) * chunk_size
  (scores, ids), _ = jax.lax.scan(merge, init, (chunks, starts))
  return scores, ids
