"""The machine a preset or a benchmark ran on, written beside every
timing: the CPU and its measured matmul rate, the accelerator, the commit."""

import os
import platform
import subprocess

from etils import epath

from realm_jax.models import flops


def machine() -> dict:
  """The CPU and its measured 2048^3 float32 matmul rate, for every timing;
  on an accelerator also the device, JAX's version and its 8192^3 bfloat16
  matmul rate."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  found = {'jax': jax.__version__, 'backend': jax.default_backend()}
  if found['backend'] != 'cpu':
    found.update(device=jax.devices()[0].device_kind,
                 devices=jax.device_count(),
                 bf16_matmul_tflops=round(
                     flops.measured_matmul(jnp.bfloat16, 8192,
                                           accumulate=jnp.float32) / 1e12,
                     1))
  rate = flops.measured_matmul(jnp.float32, 2048)
  model = platform.processor() or platform.machine()
  try:
    model = next(line.split(':', 1)[1].strip() for line in
                 epath.Path('/proc/cpuinfo').read_text().splitlines()
                 if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  return {'cpu': model, 'cores': os.cpu_count(),
          'matmul_2048_gflops': round(rate / 1e9, 1),
          'commit': commit(), **found}


def commit() -> str | None:
  """The source's git commit, '+changes' when tracked files differ from
  it (None outside a checkout): which code a record's figures came from."""
  here = os.path.dirname(os.path.abspath(__file__))
  git = lambda *a: subprocess.run(['git', '-C', here, *a], check=True,
                                  capture_output=True, text=True).stdout
  try:
    head = git('rev-parse', '--short=7', 'HEAD').strip()
    changed = git('status', '--porcelain', '--untracked-files=no').strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  return head + ('+changes' if changed else '')
