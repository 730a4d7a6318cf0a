"""The TensorFlow stack: an extra of realm-jax, imported only where needed.

The core (training, the index builder, exact search, evaluation, `ask`,
`fill`, `search`) runs on jax, flax, optax, orbax and gin alone, as GPU and
TPU machines have them; it reads pre-tokenized arrays (`data.example_arrays`,
`data.block_store`). Building a corpus from raw text, the seqio tasks,
spaCy's annotation and ScaNN need TensorFlow and its companions, installed
by `pip install 'realm-jax[tf]'`. Code on those paths imports them through
`require`, so that a machine without them stops with one line naming the
extra, not an ImportError from deep inside.
"""

import importlib

from realm_jax import errors

EXTRA = 'tf'
# The top-level modules of the extra: the core's modules import none of them
# (tests/test_layering.py).
TF_STACK = ('tensorflow', 'tensorflow_text', 'seqio', 'scann', 'spacy', 'clu')


class MissingExtra(errors.UserError, ImportError):
  """A command that needs the TensorFlow extra, run where it is not."""


def require(module: str, needed_for: str, instead: str | None = None,
            extra: str = EXTRA):
  """`module`, imported; else MissingExtra, one line naming what needed it
  and the extra to install (and `instead`: a TF-free way, if any)."""
  try:
    return importlib.import_module(module)
  except ImportError as error:
    raise MissingExtra(
        f'{needed_for} needs {module.split(".")[0]}, which is not installed: '
        f"pip install 'realm-jax[{extra}]'"
        + (f', or {instead}' if instead else '') + '.') from error
