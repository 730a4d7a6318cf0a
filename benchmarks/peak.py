"""The hardware limit that utilisation is measured against.

Accelerators have a published dense peak (bf16). A CPU's depends on its
clock, vector units and how many cores the container really gets, so there
the peak is measured: the median rate of a large matmul, the better of
JAX's and (when installed) PyTorch's (stated as `measured` in the results).
"""

import functools
import statistics
import time

import jax
import jax.numpy as jnp

from realm_jax.models.flops import NOMINAL_BF16


def measured_matmul(dtype=jnp.float32, size: int = 2048,
                    calls: int = 5, accumulate=None) -> float:
  """FLOP/s of an n x n x n JAX matmul on device 0, median of `calls`;
  its result in `accumulate` (default `dtype`): bfloat16 operands with a
  float32 result is the mixed-precision policy's product."""
  x = jnp.ones((size, size), dtype)
  matmul = jax.jit(lambda a, b: jnp.matmul(a, b,
                                           preferred_element_type=accumulate))
  matmul(x, x).block_until_ready()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    matmul(x, x).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * size ** 3 / statistics.median(times)


@functools.cache
def device_peak(dtype=jnp.float32) -> tuple[float, str]:
  """(FLOP/s of one device, where the figure comes from)."""
  kind = jax.devices()[0].device_kind
  if dtype == jnp.bfloat16 and kind in NOMINAL_BF16:
    return NOMINAL_BF16[kind], f'{kind} data sheet, dense bf16'
  name = jnp.dtype(dtype).name
  rates = {'JAX': measured_matmul(dtype)}
  if kind == 'cpu':
    rates.update(torch_matmul(name))
  best = max(rates, key=rates.get)
  return rates[best], f'measured: 2048^3 {name} matmul in {best} on {kind}'


def torch_matmul(dtype: str, size: int = 2048, calls: int = 5) -> dict:
  """PyTorch's CPU GEMM (oneDNN/MKL), when installed: it beats XLA's on
  some CPUs, and the peak is the best any library reaches."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  x = torch.ones(size, size, dtype=getattr(torch, dtype))
  torch.mm(x, x)
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    torch.mm(x, x)
    times.append(time.perf_counter() - start)
  return {'PyTorch': 2 * size ** 3 / statistics.median(times)}
