"""Open-QA metrics on the tricky cases."""

import pytest

from realm_jax.evaluation import metrics


@pytest.mark.parametrize('prediction,references,expected', [
    ('The Beatles', ['Beatles'], True),               # Articles.
    ('an apple', ['Apple.'], True),                   # Articles, punctuation.
    ('Rock  and\troll!', ['rock and roll'], True),    # Whitespace.
    ('Café', ['CAFÉ'], True),                         # Case, NFD both sides.
    ('Cafe', ['Café'], False),                        # Accents are kept.
    ('Paris', ['London', 'paris'], True),             # Max over references.
    ('theater', ['the ater'], False),                 # "the" only as a word.
    ('', ['a'], True),                                # Both normalize to ''.
])
def test_exact_match(prediction, references, expected):
  assert metrics.exact_match_score(prediction, references) is expected


def test_exact_match_metric_is_a_percentage():
  got = metrics.exact_match([['Paris'], ['1969', 'July 1969']],
                            ['paris', 'June 1969'])
  assert got == {'exact_match': 50.0}


@pytest.mark.parametrize('prediction,patterns,expected', [
    ('September', ['Sept?(ember)?|Feb(ruary)?'], True),
    ('february 9', ['Sept?(ember)?|Feb(ruary)?'], True),   # IGNORECASE, prefix.
    ('in February', ['Feb(ruary)?'], False),               # Anchored at start.
    ('Long Island', ['(unclosed', 'Long Island'], True),   # Invalid skipped.
    ('x', ['(unclosed'], False),                           # Invalid is wrong.
])
def test_regex_match(prediction, patterns, expected):
  assert metrics.regex_match_score(prediction, patterns) is expected


def test_regex_metric_reports_invalid_patterns():
  got = metrics.regex_match([['(unclosed'], ['Saudi Arabia']],
                            ['x', 'saudi arabia'])
  assert got == {'regex_match': 50.0, 'invalid_patterns': 1.0}


def test_recall_at_k_counts_answer_containing_blocks():
  targets = [['Charles Darwin'], ['1969'], ['Mars']]
  retrieved = [['On the Origin of Species was written by Charles Darwin.',
                'x'],
               ['nothing here', 'Apollo 11 landed in July 1969.'],
               ['Venus is hot.', 'Marshmallows']]  # "Mars" is not a word here.
  assert metrics.answer_recall_at_k(targets, retrieved, k=1) == {
      'recall@1': pytest.approx(100 / 3)}
  assert metrics.answer_recall_at_k(targets, retrieved, k=2) == {
      'recall@2': pytest.approx(200 / 3)}
  assert metrics.answer_recall_at_k([['Feb(ruary)?']], [['Due on february 3']],
                                    k=1, regex=True) == {'recall@1': 100.0}
