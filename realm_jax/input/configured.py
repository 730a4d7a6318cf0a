"""The one place gin chooses a run's source of examples (`Examples.source`),
asked where a run is loaded (`training.run_loader`); everything after it is
handed the `Source` it returns."""

import gin

from realm_jax import errors
from realm_jax.input.arrays import ArraysSource
from realm_jax.input.seqio_source import SeqioSource
from realm_jax.input.source import Source

SOURCES = ('seqio', 'arrays')


@gin.configurable('Examples')
def configured_source(source: str = 'seqio',
                      arrays_dir: str | None = None) -> Source:
  """The source a gin config names.

  Args:
    source: 'seqio' (the seqio tasks; needs the TensorFlow extra) or
      'arrays' (pre-tokenized arrays, `realm-jax data export`).
    arrays_dir: the arrays' root (default $REALM_ARRAYS_DIR, else
      runs/arrays), holding <task>/<split>/.
  """
  if source == 'seqio':
    return SeqioSource()
  if source == 'arrays':
    return ArraysSource(arrays_dir)
  raise errors.BadConfig(f'Examples.source={source!r}; expected one of '
                         f'{SOURCES}.')
