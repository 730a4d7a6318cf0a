"""Which hardware a program is traced for.

A few choices in the model depend on the chip the program will run on, not
on the chip tracing it: the attention kernel (cuDNN's fused attention on
GPUs, the Pallas splash kernel on TPUs, the chunked XLA form on CPUs) and
whether a bfloat16 product returns bfloat16 (accelerators, which accumulate
in float32 anyway) or float32 (XLA:CPU). An ahead-of-time compile for a TPU
traces on a CPU host, so `jax.default_backend()` would give it the CPU's
program. Whoever owns the devices (the trainer's mesh, the index builder's)
traces under `compiling_for(platform, mesh)`; elsewhere the default backend
is the target. The mesh is what a kernel the partitioner cannot split (a
Pallas kernel) is mapped over with shard_map.
"""

import contextlib
import contextvars

import jax

PLATFORMS = ('cpu', 'gpu', 'tpu')

_TARGET: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    'realm_jax_target', default=None)


def platform_of(devices) -> str:
  """'cpu', 'gpu' or 'tpu' for a sequence (or mesh array) of devices."""
  device = next(iter(getattr(devices, 'flat', devices)))
  platform = device.platform.lower()
  # ROCm and CUDA devices both run the GPU program.
  return 'gpu' if platform in ('cuda', 'rocm') else platform


@contextlib.contextmanager
def compiling_for(platform: str, mesh=None):
  """Traces inside the block build `platform`'s program, over `mesh`."""
  if platform not in PLATFORMS:
    raise ValueError(f'target platform {platform!r}; expected one of '
                     f'{PLATFORMS}.')
  token = _TARGET.set((platform, mesh))
  try:
    yield
  finally:
    _TARGET.reset(token)


def target_platform() -> str:
  """The platform a trace is for: `compiling_for`'s, else the default."""
  current = _TARGET.get()
  if current is not None:
    return current[0]
  platform = jax.default_backend()
  return 'gpu' if platform in ('cuda', 'rocm') else platform


def target_mesh():
  """The mesh `compiling_for` names, or None."""
  current = _TARGET.get()
  return None if current is None else current[1]
