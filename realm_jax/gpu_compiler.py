"""XLA:GPU on a machine without a GPU: JAX's CUDA plugin, installed apart.

`realm-jax aot --target=gpu:h100` compiles for NVIDIA GPUs through the
plugin's compiler alone (realm_jax/aot.py, `gpu_target`). The plugin and
the cuDNN it builds attention with (about 650 MB, so `make gpu-compiler`,
not `make setup`) live in <sys.prefix>/xla-cuda or $REALM_JAX_XLA_CUDA,
where no other command sees them. JAX finds a plugin, and the cuDNN its
fused attention checks for, only as it is imported, so `use` runs before
`import jax`; this module imports nothing of JAX.
"""

import importlib.metadata
import os
import re
import sys

from etils import epath

from realm_jax import errors, extras

# The plugin at this jaxlib's version (JAX refuses another) and its cuDNN.
PINS = ('jax-cuda13-plugin==0.10.2', 'jax-cuda13-pjrt==0.10.2',
        'nvidia-cudnn-cu13==9.28.1.4')
DIR_ENV = 'REALM_JAX_XLA_CUDA'
# The cards `realm-jax aot --target=gpu:<card>` knows (realm_jax/aot.py's
# GPUS describes each to the compiler).
CARDS = ('h100', 'h200')


def parse(name: str) -> tuple[str, int]:
  """'<card>[x<count>]' (e.g. 'h100', 'h100x8') -> (card, count);
  BadConfig for anything else."""
  match = re.fullmatch(r'([a-z]+\d+)(?:x([1-9]\d*))?', name)
  if not match or match.group(1) not in CARDS:
    raise errors.BadConfig(
        f'GPU {name!r}: expected <card>[x<count>] with card one of '
        f'{", ".join(CARDS)}, e.g. gpu:h100 or gpu:h100x8.')
  return match.group(1), int(match.group(2) or 1)


def directory() -> str:
  """$REALM_JAX_XLA_CUDA, else <sys.prefix>/xla-cuda."""
  return os.environ.get(DIR_ENV) or os.path.join(sys.prefix, 'xla-cuda')


def installed() -> bool:
  return epath.Path(directory(), 'jax_plugins', 'xla_cuda13').is_dir()


def version() -> str | None:
  """The installed plugin's version, None if it is not there."""
  found = list(importlib.metadata.distributions(name='jax-cuda13-plugin',
                                                path=[directory()]))
  return found[0].version if found else None


def use() -> str:
  """Puts the plugin on this process's path, before JAX starts; its
  directory. Its start-up check of the CUDA runtime, which fails without a
  GPU, is skipped: only the compiler is used (the variable is left set,
  for the processes this one starts). MissingExtra, one line saying how to
  install it, where it is not, or not for this jaxlib."""
  apart = directory()
  install = (f'`make gpu-compiler` installs it there, or `pip install '
             f'--no-deps --target {apart} {" ".join(PINS)}`.')
  if not installed():
    raise extras.MissingExtra(
        "Compiling for a GPU without one needs JAX's CUDA plugin, which is "
        f'not in {apart}: {install}')
  jaxlib = importlib.metadata.version('jaxlib')
  if version() != jaxlib:  # JAX refuses a plugin of another jaxlib.
    raise extras.MissingExtra(
        f"JAX's CUDA plugin in {apart} is version {version()}, not jaxlib's "
        f'{jaxlib}: {install}')
  if apart not in sys.path:
    sys.path.append(apart)
  os.environ['JAX_SKIP_CUDA_CONSTRAINTS_CHECK'] = '1'
  return apart
