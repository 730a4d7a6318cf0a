"""XLA:GPU on a machine without a GPU: JAX's CUDA plugin, installed apart.

`realm-jax aot --target=gpu:h100` compiles for NVIDIA GPUs through the
plugin's compiler alone (realm_jax/aot.py, `gpu_target`). The plugin and
the cuDNN it builds attention with (about 650 MB, so `make gpu-compiler`,
not `make setup`) live in <sys.prefix>/xla-cuda or $REALM_JAX_XLA_CUDA,
where no other command sees them. JAX finds a plugin, and the cuDNN its
fused attention checks for, only as it is imported, so `use` runs before
`import jax`; this module imports nothing of JAX.
"""

import os
import sys

from realm_jax import extras

# The plugin at this jaxlib's version (JAX refuses another) and its cuDNN.
PINS = ('jax-cuda13-plugin==0.10.2', 'jax-cuda13-pjrt==0.10.2',
        'nvidia-cudnn-cu13==9.28.1.4')
DIR_ENV = 'REALM_JAX_XLA_CUDA'


def directory() -> str:
  """$REALM_JAX_XLA_CUDA, else <sys.prefix>/xla-cuda."""
  return os.environ.get(DIR_ENV) or os.path.join(sys.prefix, 'xla-cuda')


def installed() -> bool:
  return os.path.isdir(os.path.join(directory(), 'jax_plugins', 'xla_cuda13'))


def use() -> str:
  """Puts the plugin on this process's path, before JAX starts; its
  directory. Its start-up check of the CUDA runtime, which fails without a
  GPU, is skipped: only the compiler is used. MissingExtra, one line
  saying how to install it, where it is not."""
  apart = directory()
  if not installed():
    raise extras.MissingExtra(
        f"Compiling for a GPU without one needs JAX's CUDA plugin, which is "
        f'not in {apart}: `make gpu-compiler` installs it there, or `pip '
        f'install --no-deps --target {apart} {" ".join(PINS)}`.')
  if apart not in sys.path:
    sys.path.append(apart)
  os.environ['JAX_SKIP_CUDA_CONSTRAINTS_CHECK'] = '1'
  return apart
