"""The first stage of exact search's two-stage top-k in one kernel: each
group's highest score per query, without the scores ever reaching memory.

The two-stage top-k (realm_jax.index.exact) needs, of the [queries x rows]
float32 scores, only the maxima over groups of `group` consecutive rows,
then the scores of the few best groups again. Written by a matrix product
and read back by a reduction, those scores bound the search: over 13.35M
rows and 512 queries they are 27.3 GB each way, 16.3 ms of an H100's
memory against 1.77 ms of its compute. Here a Pallas kernel scores one
group of rows against a block of queries on chip and writes only the
group's maximum per query: a `group`-th of those bytes. It reads the rows
in place, the whole table at once: no chunk of it is sliced or copied.

Kernels, by the platform the program is for:
  - GPU (Triton): a program per block of `program_queries` queries and
    span of `program_groups` groups, for groups Triton takes as one tile
    (`triton_tiles`); it loads its queries once and scores the span's
    groups in turn, the last span only the groups left.
  - TPU (Mosaic): a program per `TPU_GROUPS_PER_STEP` groups, every query
    at once, for groups of a multiple of 128 rows (Mosaic's tiling of the
    rows' [n] mask); the groups after the last whole step take the XLA form.
  - Otherwise (CPUs, other shapes): the XLA form (`reference`), which is
    what the kernels compute, a block of groups at a time.
`interpret`: the kernel in Pallas's interpreter, on any platform (how the
CPU tests check the kernels against `reference`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Queries a GPU program scores at once, by default and at most, and the
# largest [queries x group] float32 block of scores a program keeps: in
# registers for 128 x 256 and 256 x 128, spilled for 256 x 256 (XLA:GPU's
# compile for an H100 assembled by ptxas; docs/benchmarks.md, "What bounds
# the search").
BLOCK_QUERIES = 128
TRITON_MAX_QUERIES = 256
TRITON_MAX_SCORES = 128 * 256
# Triton's largest group, and the largest tile of rows, one program takes
# in one product (the rest of its shared memory holds the queries).
TRITON_MAX_GROUP = 256
TRITON_MAX_TILE_BYTES = 64 * 1024
# Groups a TPU program scores: its output block is whole sublane rows of
# every query, and its rows ([16 x group, dim]) a few MiB of VMEM.
TPU_GROUPS_PER_STEP = 16
TPU_LANES = 128
# Groups the XLA form scores at once: [queries x 512 x group] float32.
REFERENCE_GROUPS = 512


def precision_for(dtype):
  """float32 rows at full precision: Triton's and XLA:GPU's default takes
  TF32, whose 1e-3 error would pick other groups than the exact scores."""
  return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _scores(queries, rows):
  """[Q, n] float32 inner products, at the precision the kernels use."""
  return jnp.einsum('qd,nd->qn', queries, rows,
                    preferred_element_type=jnp.float32,
                    precision=precision_for(rows.dtype))


def reference(queries, rows, bias, group: int):
  """[Q, n // group] float32: per query, the maximum over each whole group
  of `group` consecutive rows of queries . row + bias (bias [n]: 0 where a
  row may be returned, -inf where not); the last n % group rows are not
  read. REFERENCE_GROUPS groups at a time, sliced in place."""
  groups = rows.shape[0] // group
  size = REFERENCE_GROUPS * group

  def maxima(rows, bias):
    return (_scores(queries, rows) + bias).reshape(
        queries.shape[0], -1, group).max(axis=-1)

  def block(start):
    return maxima(jax.lax.dynamic_slice_in_dim(rows, start, size),
                  jax.lax.dynamic_slice_in_dim(bias, start, size))

  blocks, rest = divmod(groups, REFERENCE_GROUPS)
  parts = []
  if blocks:
    stacked = jax.lax.map(block, jnp.arange(blocks, dtype=jnp.int32) * size)
    parts.append(stacked.transpose(1, 0, 2).reshape(queries.shape[0], -1))
  if rest:
    start = blocks * size
    parts.append(maxima(rows[start:groups * group],
                        bias[start:groups * group]))
  if not parts:
    return jnp.zeros((queries.shape[0], 0), jnp.float32)
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def _kernel(queries_ref, rows_ref, bias_ref, out_ref, *, group: int,
            groups: int):
  """out [groups, queries] <- the maxima of `groups` groups of rows (TPU)."""
  queries = queries_ref[...]
  for g in range(groups):
    span = slice(g * group, (g + 1) * group)
    # [group, queries]: the rows on the long axis, so the maximum over a
    # group is over the block's rows and lands as a row of the output.
    products = jax.lax.dot_general(
        rows_ref[span, :], queries, (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=precision_for(rows_ref.dtype))
    products = products + bias_ref[span][:, None]
    out_ref[g:g + 1, :] = jnp.max(products, axis=0, keepdims=True)


def _queries_major_kernel(queries_ref, rows_ref, bias_ref, out_ref, *,
                          group: int, program_groups: int, groups: int):
  """out [queries, program_groups] <- the maxima of a span of groups for a
  block of queries (GPU), the queries loaded once for the span; the last
  span stops at the table's `groups`-th group."""
  queries = queries_ref[...]

  def best(rows, bias):
    products = jax.lax.dot_general(
        queries, rows, (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=precision_for(rows_ref.dtype))
    return jnp.max(products + bias[None, :], axis=1, keepdims=True)

  def score(g, maxima):
    span = pl.ds(pl.multiple_of(g * group, group), group)
    column = jax.lax.broadcasted_iota(jnp.int32, maxima.shape, 1)
    return jnp.where(column == g, best(rows_ref[span, :], bias_ref[span]),
                     maxima)

  if program_groups == 1:
    out_ref[...] = best(rows_ref[...], bias_ref[...])
    return
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas import triton as plgpu
  last = jnp.minimum(program_groups,
                     groups - pl.program_id(1) * program_groups)
  maxima = jax.lax.fori_loop(0, last, score,
                             jnp.zeros(out_ref.shape, jnp.float32))
  # The last span's block reaches past the table's groups, and Triton
  # stores a block whole: unmasked, its columns past the end would land on
  # the next query's first groups.
  column = jax.lax.broadcasted_iota(jnp.int32, out_ref.shape, 1)
  plgpu.store(out_ref, maxima, mask=column < last)


def triton_tiles(group: int, dim: int, itemsize: int) -> bool:
  """Whether a Triton program takes a group of rows as one tile: powers of
  two from 16, at most TRITON_MAX_GROUP rows and TRITON_MAX_TILE_BYTES."""
  return (all(n >= 16 and n & (n - 1) == 0 for n in (group, dim))
          and group <= TRITON_MAX_GROUP
          and group * dim * itemsize <= TRITON_MAX_TILE_BYTES)


def _padded(queries, multiple: int):
  padding = -queries.shape[0] % multiple
  return jnp.pad(queries, ((0, padding), (0, 0))) if padding else queries


def check_program(program_queries: int, program_groups: int,
                  group: int) -> None:
  """A GPU program's shape: powers of two, at most TRITON_MAX_QUERIES
  queries of at least 16 (Triton's smallest product), and for groups the
  kernel takes, at most TRITON_MAX_SCORES scores at once."""
  if program_groups < 1 or program_groups & (program_groups - 1):
    raise ValueError(f'program_groups={program_groups}: a power of two.')
  if not (16 <= program_queries <= TRITON_MAX_QUERIES
          and program_queries & (program_queries - 1) == 0):
    raise ValueError(f'program_queries={program_queries}: a power of two '
                     f'from 16 to {TRITON_MAX_QUERIES}.')
  if (group <= TRITON_MAX_GROUP
      and program_queries * group > TRITON_MAX_SCORES):
    raise ValueError(f'program_queries={program_queries} against groups of '
                     f'{group}: at most {TRITON_MAX_SCORES:,} scores a '
                     'program (more spill out of registers).')


def _gpu_maxima(queries, rows, bias, group: int, program_queries: int,
                program_groups: int, interpret: bool):
  """[Q, n // group]: one Triton program per block of queries and span of
  `program_groups` groups (the last span: those left).

  The kernel writes the maxima queries-major, as the top-k over groups
  reads them. Written groups-major and transposed, they reached XLA:GPU's
  TopK kernel as a column-major bitcast, which it read as row-major: the
  wrong groups, silently (jax 0.11.2, H100)."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas import triton as plgpu
  num_queries, dim = queries.shape
  block = min(program_queries, max(16, pl.next_power_of_2(num_queries)))
  queries = _padded(queries, block)
  span = program_groups * group
  groups = rows.shape[0] // group
  # The blocks of queries on the grid's first axis, which CUDA runs
  # fastest: the programs of one span run together and read its rows from
  # memory once, the rest from the L2 cache.
  maxima = pl.pallas_call(
      functools.partial(_queries_major_kernel, group=group,
                        program_groups=program_groups, groups=groups),
      out_shape=jax.ShapeDtypeStruct((queries.shape[0], groups), jnp.float32),
      grid=(queries.shape[0] // block, pl.cdiv(groups, program_groups)),
      in_specs=[pl.BlockSpec((block, dim), lambda q, s: (q, 0)),
                pl.BlockSpec((span, dim), lambda q, s: (s, 0)),
                pl.BlockSpec((span,), lambda q, s: (s,))],
      out_specs=pl.BlockSpec((block, program_groups), lambda q, s: (q, s)),
      compiler_params=plgpu.CompilerParams(num_warps=8, num_stages=2),
      interpret=interpret, name='group_maxima')(queries, rows, bias)
  return maxima[:num_queries]


def _tpu_maxima(queries, rows, bias, group: int, steps: int,
                interpret: bool):
  """[steps x TPU_GROUPS_PER_STEP, Q]: one Mosaic program per step, over
  the first steps x TPU_GROUPS_PER_STEP groups."""
  num_queries, dim = queries.shape
  queries = _padded(queries, TPU_LANES)
  step = TPU_GROUPS_PER_STEP * group
  maxima = pl.pallas_call(
      functools.partial(_kernel, group=group, groups=TPU_GROUPS_PER_STEP),
      out_shape=jax.ShapeDtypeStruct(
          (steps * TPU_GROUPS_PER_STEP, queries.shape[0]), jnp.float32),
      grid=(steps,),
      in_specs=[pl.BlockSpec((queries.shape[0], dim), lambda s: (0, 0)),
                pl.BlockSpec((step, dim), lambda s: (s, 0)),
                pl.BlockSpec((step,), lambda s: (s,))],
      out_specs=pl.BlockSpec((TPU_GROUPS_PER_STEP, queries.shape[0]),
                             lambda s: (s, 0)),
      interpret=interpret, name='group_maxima')(queries, rows, bias)
  return maxima[:, :num_queries]


def group_maxima(queries, rows, bias, group: int, platform: str,
                 interpret: bool = False, program_groups: int = 1,
                 program_queries: int = BLOCK_QUERIES):
  """`reference`'s [Q, n // group] float32 maxima of the whole groups, by
  `platform`'s kernel where it has one (see the module's docstring); a GPU
  program scores `program_queries` queries against `program_groups` groups
  in turn (`check_program`). The queries must have the rows' dtype; the
  products accumulate in float32, at full precision for float32 rows."""
  if queries.dtype != rows.dtype:
    raise ValueError(f'queries of {queries.dtype} against rows of '
                     f'{rows.dtype}: give both the same dtype.')
  check_program(program_queries, program_groups, group)
  num_rows, dim = rows.shape
  if platform == 'gpu' and triton_tiles(group, dim, rows.dtype.itemsize):
    return _gpu_maxima(queries, rows, bias, group, program_queries,
                       program_groups, interpret)
  steps = num_rows // (TPU_GROUPS_PER_STEP * group)
  if platform == 'tpu' and group % TPU_LANES == 0 and steps:
    head = steps * TPU_GROUPS_PER_STEP * group
    kernel = _tpu_maxima(queries, rows, bias, group, steps, interpret).T
    # The groups after the last step: fewer than TPU_GROUPS_PER_STEP.
    rest = reference(queries, rows[head:], bias[head:], group)
    return jnp.concatenate([kernel, rest], axis=1)
  return reference(queries, rows, bias, group)
