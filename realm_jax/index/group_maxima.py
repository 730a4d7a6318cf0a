"""The first stage of exact search's two-stage top-k in one kernel: each
group's highest score per query, without the scores ever reaching memory.

The two-stage top-k (realm_jax.index.exact) needs, of a chunk's
[queries x rows] float32 scores, only the maxima over groups of `group`
consecutive rows, then the scores of the few best groups again. Written by
a matrix product and read back by a reduction, those scores bound the
search: over 13.35M rows and 512 queries they are 27.3 GB each way, 16.3 ms
of an H100's memory against 1.77 ms of its compute. Here a Pallas kernel
scores one group of rows against a block of queries on chip and writes
only the group's maximum per query: a `group`-th of those bytes.

Kernels, by the platform the program is for:
  - GPU (Triton): a program per group and block of `BLOCK_QUERIES`
    queries; Triton tiles powers of two, so other dimensions, or groups,
    take the XLA form. Not yet timed on a GPU (docs/benchmarks.md).
  - TPU (Mosaic): a program per `TPU_GROUPS_PER_STEP` groups, every query
    at once, for groups of a multiple of 128 rows (Mosaic's tiling of the
    rows' [n] mask); the groups after the last whole step take the XLA form.
  - CPU: the XLA form (`reference`), which is what the kernels compute.
`interpret`: the kernel in Pallas's interpreter, on any platform (how the
CPU tests check the kernels against `reference`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Queries a GPU program scores at once: a [group x 128] float32 block of
# scores per program stays in registers for groups of up to 256.
BLOCK_QUERIES = 128
# Groups a TPU program scores: its output block is then whole sublane rows
# (8) of every query.
TPU_GROUPS_PER_STEP = 8


def reference(queries, rows, bias, group: int):
  """[Q, n / group] float32: per query, the maximum over each group of
  `group` consecutive rows of queries . row + bias (bias [n]: 0 where a row
  may be returned, -inf where not). n must be whole groups."""
  scores = jnp.einsum('qd,nd->qn', queries, rows,
                      preferred_element_type=jnp.float32) + bias
  return scores.reshape(queries.shape[0], -1, group).max(axis=-1)


def _kernel(queries_ref, rows_ref, bias_ref, out_ref, *, group: int,
            groups: int):
  """out [groups, queries] <- the maxima of `groups` groups of rows."""
  queries = queries_ref[...]
  for g in range(groups):
    span = slice(g * group, (g + 1) * group)
    # [group, queries]: the rows on the long axis, so the maximum over a
    # group is over the block's rows and lands as a row of the output.
    scores = jax.lax.dot_general(rows_ref[span, :], queries,
                                 (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    scores = scores + bias_ref[span][:, None]
    out_ref[g:g + 1, :] = jnp.max(scores, axis=0, keepdims=True)


def _power_of_two(n: int) -> bool:
  return n >= 16 and n & (n - 1) == 0


def _gpu_maxima(queries, rows, bias, group: int, interpret: bool):
  """[n / group, Q]: one Triton program per group and block of queries."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas import triton as plgpu
  num_queries, dim = queries.shape
  block = min(BLOCK_QUERIES, max(16, pl.next_power_of_2(num_queries)))
  padded = pl.cdiv(num_queries, block) * block
  queries = jnp.pad(queries, ((0, padded - num_queries), (0, 0)))
  groups = rows.shape[0] // group
  # The blocks of queries on the grid's first axis, which CUDA runs
  # fastest: the programs of one group run together and read its rows from
  # memory once, the rest from the L2 cache.
  maxima = pl.pallas_call(
      functools.partial(_kernel, group=group, groups=1),
      out_shape=jax.ShapeDtypeStruct((groups, padded), jnp.float32),
      grid=(padded // block, groups),
      in_specs=[pl.BlockSpec((block, dim), lambda q, g: (q, 0)),
                pl.BlockSpec((group, dim), lambda q, g: (g, 0)),
                pl.BlockSpec((group,), lambda q, g: (g,))],
      out_specs=pl.BlockSpec((1, block), lambda q, g: (g, q)),
      compiler_params=plgpu.CompilerParams(num_warps=8, num_stages=2),
      interpret=interpret, name='group_maxima')(queries, rows, bias)
  return maxima[:, :num_queries]


def _tpu_maxima(queries, rows, bias, group: int, interpret: bool):
  """[n / group, Q]: one Mosaic program per TPU_GROUPS_PER_STEP groups."""
  num_queries, dim = queries.shape
  step = TPU_GROUPS_PER_STEP * group
  return pl.pallas_call(
      functools.partial(_kernel, group=group, groups=TPU_GROUPS_PER_STEP),
      out_shape=jax.ShapeDtypeStruct((rows.shape[0] // group, num_queries),
                                     jnp.float32),
      grid=(rows.shape[0] // step,),
      in_specs=[pl.BlockSpec((num_queries, dim), lambda s: (0, 0)),
                pl.BlockSpec((step, dim), lambda s: (s, 0)),
                pl.BlockSpec((step,), lambda s: (s,))],
      out_specs=pl.BlockSpec((TPU_GROUPS_PER_STEP, num_queries),
                             lambda s: (s, 0)),
      interpret=interpret, name='group_maxima')(queries, rows, bias)


def group_maxima(queries, rows, bias, group: int, platform: str,
                 interpret: bool = False):
  """`reference`'s [Q, n / group] float32 maxima, by `platform`'s kernel
  (see the module's docstring). The queries take the rows' dtype (a
  float32 query of bfloat16 rows is rounded, as the rows were); the
  products accumulate in float32, at full precision for float32 rows."""
  num_rows, dim = rows.shape
  if num_rows % group:
    raise ValueError(f'{num_rows} rows are not whole groups of {group}.')
  queries = queries.astype(rows.dtype)
  if platform == 'gpu' and _power_of_two(group) and _power_of_two(dim):
    return _gpu_maxima(queries, rows, bias, group, interpret).T
  if platform == 'tpu' and group % 128 == 0:
    step = TPU_GROUPS_PER_STEP * group
    head = num_rows - num_rows % step
    parts = []
    if head:
      parts.append(_tpu_maxima(queries, rows[:head], bias[:head], group,
                               interpret).T)
    if head < num_rows:
      parts.append(reference(queries, rows[head:], bias[head:], group))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
  return reference(queries, rows, bias, group)
