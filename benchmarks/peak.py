"""The hardware limits that utilisation is measured against.

Accelerators have a published dense peak (bf16) and memory bandwidth. A
CPU's depend on its clock, vector units and how many cores the container
really gets, so there they are measured: the median rate of a large matmul,
the better of JAX's and (when installed) PyTorch's, and of a reduction over
a large array (stated as `measured` in the results).
"""

import functools
import statistics
import time

import jax
import jax.numpy as jnp

from realm_jax.models.flops import NOMINAL_BF16, measured_matmul

# Memory bandwidth per chip (bytes/s), from the vendors' data sheets: the
# time to read an operand once is its bytes over this. The names are JAX's
# `device_kind`s.
NOMINAL_HBM = {
    'TPU v4': 1.2e12,
    'TPU v5 lite': 819e9,
    'TPU v5p': 2.765e12,
    'NVIDIA H100 80GB HBM3': 3.35e12,
    'NVIDIA H200': 4.8e12,
    'NVIDIA A100-SXM4-80GB': 2.039e12,
}


@functools.cache
def device_peak(dtype=jnp.float32, accumulate=None) -> tuple[float, str]:
  """(FLOP/s of one device, where the figure comes from); `accumulate`:
  the product's result dtype where measured (default `dtype`)."""
  kind = jax.devices()[0].device_kind
  if dtype == jnp.bfloat16 and kind in NOMINAL_BF16:
    return NOMINAL_BF16[kind], f'{kind} data sheet, dense bf16'
  name = jnp.dtype(dtype).name
  into = '' if accumulate is None else f' into {jnp.dtype(accumulate).name}'
  rates = {f'JAX{into}': measured_matmul(dtype, accumulate=accumulate)}
  if jnp.dtype(dtype) == jnp.bfloat16 and accumulate is None:
    # The mixed-precision policy's product: bfloat16 operands, a float32
    # result (XLA:CPU runs it on AVX512_BF16, faster than a bfloat16 one).
    rates['JAX into float32'] = measured_matmul(dtype,
                                                accumulate=jnp.float32)
  if kind == 'cpu' and accumulate is None:
    rates.update(torch_matmul(name))
  best = max(rates, key=rates.get)
  return rates[best], f'measured: 2048^3 {name} matmul in {best} on {kind}'


def measured_read(megabytes: int = 256, calls: int = 5) -> float:
  """Bytes/s of a reduction over a `megabytes` float32 array on device 0,
  median of `calls`: the rate a search reads its rows at."""
  x = jnp.ones((megabytes << 18,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    total(x).block_until_ready()
    times.append(time.perf_counter() - start)
  return x.nbytes / statistics.median(times)


@functools.cache
def device_bandwidth() -> tuple[float, str]:
  """(memory bytes/s of one device, where the figure comes from)."""
  kind = jax.devices()[0].device_kind
  if kind in NOMINAL_HBM:
    return NOMINAL_HBM[kind], f'{kind} data sheet, memory bandwidth'
  return measured_read(), f'measured: a 256 MB float32 sum on {kind}'


def torch_matmul(dtype: str, size: int = 2048, calls: int = 5,
                 slow_s: float = 2.0) -> dict:
  """PyTorch's CPU GEMM (oneDNN/MKL), when installed: it beats XLA's on
  some CPUs, and the peak is the best any library reaches. Where a probe
  at a quarter of `size` (its second call) projects a call over `slow_s`
  (bfloat16 without hardware support: about a minute at 2048 on an AMD
  EPYC), the probe's rate is given: that library cannot be the best."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  probe = torch.ones(size // 4, size // 4, dtype=getattr(torch, dtype))
  torch.mm(probe, probe)  # The library's start-up is not its rate.
  start = time.perf_counter()
  torch.mm(probe, probe)
  probe_s = time.perf_counter() - start
  if probe_s * 64 > slow_s:
    return {'PyTorch': 2 * (size // 4) ** 3 / probe_s}
  x = torch.ones(size, size, dtype=getattr(torch, dtype))
  torch.mm(x, x)
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    torch.mm(x, x)
    times.append(time.perf_counter() - start)
  return {'PyTorch': 2 * size ** 3 / statistics.median(times)}
