"""Candidate documents of each query: selection, gathering and reader inputs.

REALM reads k candidates per query: the null document (an empty block, always
at index 0, so the reader may rely on its parameters alone) followed by the top
retrieved blocks, with the trivial candidate (the query's own source block)
and duplicates dropped and the rest padded and masked. All functions are jnp
and jit-safe, so retrieval may run on the host or on the device.
"""

import jax.numpy as jnp

NULL_DOCUMENT_ID = -1


def select_candidates(retrieved_ids, exclude_ids, num_candidates: int,
                      xp=jnp):
  """Null document first, then retrieved ids minus excluded ids and duplicates.

  Args:
    retrieved_ids: [batch, R] block ids, best first; negative ids are padding.
      Over-fetch (R >= num_candidates) so that exclusions leave enough.
    exclude_ids: [batch] the trivial candidate of each query (its source
      block), or negative for none.
    num_candidates: k, the null document included.
    xp: numpy for the trainer's host side: queued on the device, these small
      ops would wait behind the train step they are meant to overlap.

  Returns:
    (candidate_ids [batch, k] with NULL_DOCUMENT_ID at index 0 and on padding,
     candidate_mask [batch, k] bool, True on the null document and real ones).
  """
  retrieved_ids = xp.asarray(retrieved_ids, xp.int32)
  batch, fetched = retrieved_ids.shape
  if fetched < num_candidates - 1:
    retrieved_ids = xp.pad(retrieved_ids,
                           ((0, 0), (0, num_candidates - 1 - fetched)),
                           constant_values=NULL_DOCUMENT_ID)
    fetched = num_candidates - 1
  valid = (retrieved_ids >= 0) & (
      retrieved_ids != xp.asarray(exclude_ids, xp.int32)[:, None])
  earlier = xp.tril(xp.ones((fetched, fetched), bool), k=-1)
  duplicate = xp.any(
      (retrieved_ids[:, :, None] == retrieved_ids[:, None, :]) & earlier, axis=2)
  valid &= ~duplicate
  # Stable: valid ids move to the front in retrieval order.
  order = xp.argsort(~valid, axis=1, stable=True)[:, :num_candidates - 1]
  ids = xp.take_along_axis(retrieved_ids, order, axis=1)
  mask = xp.take_along_axis(valid, order, axis=1)
  ids = xp.where(mask, ids, NULL_DOCUMENT_ID)
  null = xp.full((batch, 1), NULL_DOCUMENT_ID, xp.int32)
  return (xp.concatenate([null, ids], axis=1),
          xp.concatenate([xp.ones((batch, 1), bool), mask], axis=1))


def null_document(length: int, cls_id: int, sep_id: int) -> dict:
  """`[CLS] [SEP] [SEP]`: an empty title and an empty body."""
  token_ids = jnp.zeros(length, jnp.int32).at[:3].set(
      jnp.array([cls_id, sep_id, sep_id]))
  return {'token_ids': token_ids,
          'token_type_ids': jnp.zeros(length, jnp.int32).at[2].set(1),
          'input_mask': jnp.zeros(length, jnp.int32).at[:3].set(1)}


def gather_blocks(blocks: dict, candidate_ids, null: dict, xp=jnp) -> dict:
  """Token arrays of each candidate: [N, L] corpus arrays -> [batch, k, L].

  `null` (see `null_document`) stands in for NULL_DOCUMENT_ID. Pass xp=numpy
  to gather on the host from corpus arrays that live in host memory.
  """
  is_null = (candidate_ids == NULL_DOCUMENT_ID)[..., None]
  safe_ids = xp.maximum(candidate_ids, 0)
  return {key: xp.where(is_null, xp.asarray(null[key]),
                        xp.take(value, safe_ids, axis=0))
          for key, value in blocks.items()}


def join_query_and_blocks(query: dict, blocks: dict, max_length: int,
                          include_title: bool = False) -> dict:
  """Reader inputs `[CLS] x [SEP] z_body [SEP]` for every candidate.

  Args:
    query: token_ids/token_type_ids/input_mask [batch, Lq] of `[CLS] x [SEP]`.
    blocks: the same keys [batch, k, Lb] of `[CLS] title [SEP] body [SEP]`
      (token type 1 on `body [SEP]`).
    max_length: reader sequence length; z is cut to fit, keeping its [SEP].
    include_title: read `[CLS] x [SEP] title [SEP] body [SEP]` instead.

  Returns:
    token_ids/token_type_ids/input_mask [batch, k, max_length], and
    `block_mask`, 1 on the tokens of z other than [SEP]: where answer spans
    may lie. x keeps its positions, so masked positions carry over.
  """
  query_length = jnp.sum(query['input_mask'], axis=-1)[:, None, None]
  block_mask = blocks['input_mask'].astype(bool)
  block_length = jnp.sum(block_mask, axis=-1)[..., None]
  title_length = jnp.sum(block_mask & (blocks['token_type_ids'] == 0),
                         axis=-1)[..., None]
  block_start = 1 if include_title else title_length  # Skip [CLS] (+ title).

  position = jnp.arange(max_length)[None, None, :]
  source = block_start + position - query_length  # Position in the block.
  in_query = position < query_length
  in_block = source < block_length
  last = jnp.minimum(query_length + block_length - block_start, max_length) - 1
  safe_source = jnp.clip(source, 0, blocks['token_ids'].shape[-1] - 1)
  query_ids = query['token_ids'][:, None, :max_length]
  query_ids = jnp.pad(query_ids, ((0, 0), (0, 0),
                                  (0, max_length - query_ids.shape[-1])))
  block_ids = jnp.take_along_axis(blocks['token_ids'], safe_source, axis=-1)
  # A cut block still ends with its [SEP] (the block's last real token).
  sep = jnp.take_along_axis(blocks['token_ids'], block_length - 1, axis=-1)
  block_ids = jnp.where(position == last, sep, block_ids)
  in_block &= ~in_query
  token_ids = jnp.where(in_query, query_ids, jnp.where(in_block, block_ids, 0))
  return {
      'token_ids': token_ids.astype(jnp.int32),
      'token_type_ids': in_block.astype(jnp.int32),
      'input_mask': (in_query | in_block).astype(jnp.int32),
      'block_mask': (in_block & (token_ids != sep)).astype(jnp.int32),
  }
