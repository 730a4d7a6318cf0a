"""A preset's figures across runs: each comparison's every interval, the
mean and range of each figure."""

import pytest

from realm_jax import repeats
from realm_jax.experiments import world_report


def _interval(difference, low, high):
  return {'a': 50 + difference, 'b': 50.0, 'difference': difference,
          'low': low, 'high': high, 'excludes_zero': low > 0 or high < 0}


def _results(seed, recall_gain, low, accuracy, edit=None):
  return {
      'seed': seed,
      'held_out': {'realm': {'masked_token_accuracy': accuracy,
                             'recall@1': 0.5 + recall_gain / 100}},
      'edit': edit and {'answered_new_value': edit},
      'timings': {'ict': 60.0, 'pretrain_realm': 120.0 + seed},
      'comparisons': {
          'realm_vs_frozen': {
              'recall@1': _interval(recall_gain, low, recall_gain + 4),
              'masked_token_accuracy': _interval(10.0, 6.0, 14.0)},
          'baseline_vs_prior': {
              'masked_token_accuracy': _interval(0.0, -0.5, 0.5)},
          'recall@1_by_template': {'realm': [0.4, 0.9], 'frozen': [0.1, 0.3]},
          'p_null': {'no_document': 0.9, 'with_document': 0.1,
                     'interval': _interval(0.8, 0.7, 0.9)}}}


@pytest.mark.unit
def test_every_interval_is_found_by_its_path():
  found = repeats.intervals(_results(0, 20.0, 16.0, 0.8)['comparisons'])
  assert sorted(found) == [
      'baseline_vs_prior/masked_token_accuracy', 'p_null/interval',
      'realm_vs_frozen/masked_token_accuracy', 'realm_vs_frozen/recall@1']
  assert found['realm_vs_frozen/recall@1']['difference'] == 20.0


@pytest.mark.unit
def test_spread_keeps_every_run_and_counts_intervals_above_zero():
  runs = [_results(0, 20.0, 16.0, 0.80, 0.95),
          _results(1, 2.0, -2.0, 0.90, 0.85),
          _results(2, 11.0, 7.0, 0.70, None)]
  summary = repeats.spread(runs, world_report.figures)
  assert summary['runs'] == 3 and summary['seeds'] == [0, 1, 2]
  recall = summary['comparisons']['realm_vs_frozen/recall@1']
  assert recall['values'] == [20.0, 2.0, 11.0]
  assert recall['mean'] == pytest.approx(11.0)
  assert (recall['min'], recall['max']) == (2.0, 20.0)
  assert recall['runs_above_zero'] == 2  # Seed 1's interval holds 0.
  assert recall['intervals'][1] == {'difference': 2.0, 'low': -2.0,
                                    'high': 6.0}
  accuracy = summary['figures']['held-out fill accuracy of REALM (%)']
  assert accuracy['mean'] == pytest.approx(80.0)
  assert (accuracy['min'], accuracy['max']) == pytest.approx((70.0, 90.0))
  # A figure one run lacks is described over the runs that have it.
  edit = summary['figures']['edited facts answered with the new value (%)']
  assert edit['values'][2] is None and edit['mean'] == pytest.approx(90.0)
  minutes = summary['figures']['whole preset (minutes)']
  assert minutes['max'] == pytest.approx(182 / 60)


@pytest.mark.unit
def test_tables_show_every_run_and_goals_need_every_interval_above_zero():
  runs = [_results(0, 20.0, 16.0, 0.85, 0.95),
          _results(1, 2.0, -2.0, 0.85, 0.95)]
  summary = repeats.spread(runs, world_report.figures)
  rows = repeats.comparison_rows(summary, world_report.COMPARISONS)
  frozen = next(r for r in rows if r.startswith(
      "| held-out recall@1 of the person's document (%): REALM vs the "
      'frozen'))
  assert frozen.endswith(
      '| +11.0 | +2.0 to +20.0 | +20.0 [+16.0, +24.0] | '
      '+2.0 [-2.0, +6.0] | 1 of 2 |')
  figure = next(r for r in repeats.figure_rows(summary)
                if r.startswith('| held-out fill accuracy of REALM'))
  assert figure == ('| held-out fill accuracy of REALM (%) | 85.0 | '
                    '85.0 to 85.0 | 85.0 | 85.0 |')
  goals = world_report.goal_rows(
      {k: d['mean'] for k, d in summary['figures'].items()},
      summary['comparisons'])
  assert ('| frozen retriever below on recall@1 | 11.0 | '
          '> 0, interval above 0 | missed |') in goals
  assert '| edited facts answered with the new value (%) | 95.0 | >= 90 | ' \
      'met |' in goals
  one = world_report.goal_rows(world_report.figures(runs[0]),
                               repeats.intervals(runs[0]['comparisons']))
  assert ('| frozen retriever below on recall@1 | 20.0 | '
          '> 0, interval above 0 | met |') in one
  # The stale run did not run: its goal is missed, not passed over.
  assert any(r.startswith('| 30x stale below fresh on recall@1 | - |')
             and r.endswith('missed |') for r in one)
