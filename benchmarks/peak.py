"""The hardware limit that utilisation is measured against.

Accelerators have a published dense peak (bf16). A CPU's depends on its
clock, vector units and how many cores the container really gets, so there
the peak is measured: the median rate of a large jitted matmul, the best
this JAX build does on this machine (stated as `measured` in the results).
"""

import functools
import statistics
import time

import jax
import jax.numpy as jnp

# Dense bf16 TFLOP/s per chip, from the vendors' data sheets.
NOMINAL_BF16 = {
    'TPU v4': 275e12,
    'TPU v5 lite': 197e12,
    'TPU v5p': 459e12,
    'NVIDIA H100 80GB HBM3': 989e12,
    'NVIDIA H200': 989e12,
    'NVIDIA A100-SXM4-80GB': 312e12,
}


def measured_matmul(dtype=jnp.float32, size: int = 2048,
                    calls: int = 5) -> float:
  """FLOP/s of an n x n x n matmul on device 0, median of `calls`."""
  x = jnp.ones((size, size), dtype)
  matmul = jax.jit(lambda a, b: a @ b)
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
  return measured_matmul(dtype), (f'measured: 2048^3 {jnp.dtype(dtype).name} '
                                  f'matmul on {kind}')
