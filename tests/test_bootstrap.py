"""The paired bootstrap interval, against what it must equal."""

import numpy as np
import pytest

from realm_jax.evaluation import bootstrap

pytestmark = pytest.mark.unit


def test_identical_models_differ_by_exactly_zero():
  a = np.random.default_rng(0).integers(0, 2, 300)
  interval = bootstrap.paired_interval(a, a)
  assert interval['difference'] == interval['low'] == interval['high'] == 0
  assert not interval['excludes_zero']


def test_a_constant_gain_per_item_has_no_spread():
  b = np.random.default_rng(1).integers(0, 3, 200).astype(float)
  interval = bootstrap.paired_interval(b + 1, b, scale=100)
  assert interval['difference'] == pytest.approx(100)
  assert interval['low'] == pytest.approx(100)
  assert interval['high'] == pytest.approx(100)
  assert interval['excludes_zero']


def test_the_metric_is_a_ratio_of_sums():
  correct_a, correct_b = np.array([3, 0, 1]), np.array([1, 1, 1])
  tokens = np.array([4, 1, 5])
  interval = bootstrap.paired_interval(correct_a, correct_b, tokens)
  assert interval['a'] == pytest.approx(4 / 10)
  assert interval['b'] == pytest.approx(3 / 10)
  assert interval['difference'] == pytest.approx(1 / 10)


def test_the_width_matches_the_normal_approximation():
  """For a mean over many items the percentile interval is close to
  +-1.96 standard errors of the paired difference."""
  rng = np.random.default_rng(2)
  a = rng.random(3000) < 0.3
  b = rng.random(3000) < 0.25
  interval = bootstrap.paired_interval(a, b, samples=4000)
  diff = a.astype(float) - b
  half = 1.96 * diff.std() / np.sqrt(len(diff))
  assert (interval['high'] - interval['low']) / 2 == pytest.approx(half,
                                                                   rel=0.1)
  assert interval['low'] < diff.mean() < interval['high']


def test_pairing_narrows_the_interval_of_correlated_models():
  rng = np.random.default_rng(3)
  b = rng.random(2000) < 0.5
  a = b | (rng.random(2000) < 0.04)  # b's hits, and a few more.
  paired = bootstrap.paired_interval(a, b)
  assert paired['excludes_zero'] and paired['low'] > 0
  unpaired_se = np.sqrt(a.var() / len(a) + b.var() / len(b))
  assert paired['high'] - paired['low'] < 2 * 1.96 * unpaired_se / 2


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match='three equal 1-D arrays'):
    bootstrap.paired_interval([1, 0], [1])
  with pytest.raises(ValueError, match='positive weight'):
    bootstrap.paired_interval([], [])


def test_describe():
  assert bootstrap.describe({'difference': 1.25, 'low': 0.4,
                             'high': 2.0}) == '+1.2 [+0.4, +2.0]'
