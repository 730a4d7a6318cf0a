"""seqio's Open-QA metrics: percentages over the predictions (the answer
rule itself: tests/test_answer_matching.py)."""

import pytest

from realm_jax.data import metrics

pytestmark = pytest.mark.unit


def test_exact_match_metric_is_a_percentage():
  got = metrics.exact_match([['Paris'], ['1969', 'July 1969']],
                            ['paris', 'June 1969'])
  assert got == {'exact_match': 50.0}


def test_regex_metric_reports_invalid_patterns():
  got = metrics.regex_match([['(unclosed'], ['Saudi Arabia']],
                            ['x', 'saudi arabia'])
  assert got == {'regex_match': 50.0, 'invalid_patterns': 1.0}

