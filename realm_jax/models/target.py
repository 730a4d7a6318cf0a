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

A program that only runs forward (the corpus embedding) is compiled by
`forward_only_jit`: on a GPU it then takes cuBLAS's products, which add a
projection's bias and the residual in the product's epilogue, where
Triton's products, XLA:GPU's default, leave each to a pass of its own over
the product (XLA:GPU's compile for an H100: BERT-base's embedding step
moves 20% fewer bytes). A training step keeps the default: its dropout
sits between the product and the residual, and the epilogue form moved
more bytes there.
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
def compiling_for(platform: str, mesh=None, forward_only: bool = False):
  """Traces inside the block build `platform`'s program, over `mesh`;
  `forward_only`: a program nothing differentiates, which `forward_only_jit`
  compiles with the options it needs."""
  if platform not in PLATFORMS:
    raise ValueError(f'target platform {platform!r}; expected one of '
                     f'{PLATFORMS}.')
  token = _TARGET.set((platform, mesh, forward_only))
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


def compiler_options(platform: str, forward_only: bool) -> dict | None:
  """XLA's options for a program of `platform`: a forward-only GPU program
  compiles its products with cuBLAS, not Triton (`bias_in_epilogue`)."""
  if platform == 'gpu' and forward_only:
    return {'xla_gpu_enable_triton_gemm': False}
  return None


def forward_only_jit(fun, platform: str, mesh=None, **jit_kwargs):
  """`jax.jit(fun, **jit_kwargs)` for a program nothing differentiates,
  traced as one for `platform` (over `mesh`) and compiled with its options:
  the trace's form and the compile's products go together."""
  def forward(*args):
    with compiling_for(platform, mesh, forward_only=True):
      return fun(*args)
  return jax.jit(forward, compiler_options=compiler_options(
      platform, forward_only=True), **jit_kwargs)


def bias_in_epilogue() -> bool:
  """Whether a projection adds its bias as cuBLAS's epilogue adds one: in
  the product's dtype, over one output axis. Only in a forward-only GPU
  program (`forward_only_jit`), whose products are cuBLAS's."""
  current = _TARGET.get()
  return current is not None and current[0] == 'gpu' and current[2]
