"""The chaos harness at its short size: each kind of fault at least once on a
real trainer and index builder, and nothing lost (docs/reliability.md has
the long run)."""

import collections

import pytest

from benchmarks import chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = 6  # One of each kind: the harness takes the kinds in turn.


@pytest.fixture(scope='module')
def work_dir(tmp_path_factory):
  """One harness directory for both tests: the second reuses the first's
  corpus, undisturbed run and compiled programs, as a second harness run
  in one directory does (each episode starts from an empty run)."""
  return str(tmp_path_factory.mktemp('chaos'))


def test_every_kind_of_fault_is_survived_with_the_same_losses(work_dir):
  result = chaos.run(num_faults=FAULTS, work_dir=work_dir, seed=3,
                     steps=20, pace=0.3)
  kinds = collections.Counter(fault['kind'] for fault in result['faults'])
  assert set(kinds) == {kind for kind, _ in chaos.FAULTS}, kinds
  assert sum(kinds.values()) == FAULTS
  for episode in result['episodes']:
    assert episode['passed'], episode
  total = chaos.summary(result)[-1]
  assert total['recovered'] == total['losses identical'] == FAULTS, total
  assert total['steps lost or wrong'] == 0


def test_a_flipped_bit_in_a_checkpoint_or_an_index_is_refused_by_name(
    work_dir):
  result = chaos.run(num_faults=2, work_dir=work_dir, seed=3, steps=20,
                     pace=0.3, only='bit flipped')
  assert sorted(f['kind'] for f in result['faults']) == [
      'damage checkpoint', 'damage index']
  for episode in result['episodes']:
    assert episode['passed'], episode
  assert all(f['outcome'] in ('refused', 'not read') for f in result['faults']
             if f['damaged']), result['faults']
  assert chaos.summary(result)[-1]['steps lost or wrong'] == 0
