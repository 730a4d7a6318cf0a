"""Progress lines report done/total, the rate and a correct ETA."""

import io

import pytest

from realm_jax.progress import Progress

pytestmark = pytest.mark.unit


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_rate_and_eta():
  clock, stream = _Clock(), io.StringIO()
  progress = Progress('embedded', 1000, unit='docs', every_s=5, stream=stream,
                      clock=clock)
  clock.now = 2.0
  progress.update(100)  # Within every_s: nothing printed yet.
  assert stream.getvalue() == ''
  clock.now = 10.0
  progress.update(100)
  assert stream.getvalue() == 'embedded 200/1,000 (20%) 20.0 docs/s ETA 0m40s\n'
  clock.now = 50.0
  progress.update(800)  # The last update always prints.
  assert stream.getvalue().splitlines()[-1] == (
      'embedded 1,000/1,000 (100%) 20.0 docs/s in 0m50s')


def test_resumed_run_rates_count_only_this_run_and_show_examples():
  clock, stream = _Clock(), io.StringIO()
  progress = Progress('train', 30, unit='steps', every_s=0, stream=stream,
                      clock=clock, done=20, also=(8, 'examples'))
  clock.now = 5.0
  progress.update(5)
  assert stream.getvalue() == (
      'train 25/30 (83%) 1.0 steps/s 8.0 examples/s ETA 0m05s\n')


@pytest.mark.parametrize('total,line', [
    (0.3, 'read 0.150/0.300 (50%) 0.1 MB/s ETA 0m02s'),
    (12.34, 'read 6.2/12.3 (50%) 3.1 MB/s ETA 0m02s'),
    (1234.5, 'read 617/1,234 (50%) 308.6 MB/s ETA 0m02s'),
])
def test_fractional_totals_show_their_figures(total, line):
  """A file read in MB: under 1 MB it once printed 'read 0/0 (30%)'."""
  clock, stream = _Clock(), io.StringIO()
  progress = Progress('read', total, unit='MB', every_s=0, stream=stream,
                      clock=clock)
  clock.now = 2.0
  progress.update(total / 2)
  assert stream.getvalue() == line + '\n'
