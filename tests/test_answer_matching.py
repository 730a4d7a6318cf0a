"""The answer rule on the tricky cases: exact match, patterns, answer-holding
blocks and recall@k."""

import pytest

from realm_jax.data import answer_matching

pytestmark = pytest.mark.unit


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
  assert answer_matching.exact_match_score(prediction, references) is expected


@pytest.mark.parametrize('prediction,patterns,expected', [
    ('September', ['Sept?(ember)?|Feb(ruary)?'], True),
    ('february 9', ['Sept?(ember)?|Feb(ruary)?'], True),   # IGNORECASE, prefix.
    ('in February', ['Feb(ruary)?'], False),               # Anchored at start.
    ('Long Island', ['(unclosed', 'Long Island'], True),   # Invalid skipped.
    ('x', ['(unclosed'], False),                           # Invalid is wrong.
])
def test_regex_match(prediction, patterns, expected):
  assert answer_matching.regex_match_score(prediction, patterns) is expected


@pytest.mark.parametrize('text,references,regex,expected', [
    ('Written by Charles Darwin.', ['charles darwin'], False, True),
    ('Marshmallows', ['Mars'], False, False),          # Whole words only.
    ('Off to the Moon', ['a moon'], False, True),      # Articles dropped.
    ('nothing', ['the'], False, False),                # '' is no answer.
    ('Due on february 3', ['Feb(ruary)?'], True, True),  # Anywhere, any case.
    ('x', ['(unclosed'], True, False),                 # Invalid is no answer.
])
def test_has_answer(text, references, regex, expected):
  assert answer_matching.has_answer(text, references, regex) is expected


def test_answer_in_top_k_is_one_question_s_recall():
  top_k = ['nothing here', 'Apollo 11 landed in July 1969.']
  assert answer_matching.answer_in_top_k(['1969'], top_k, regex=False)
  assert not answer_matching.answer_in_top_k(['1970'], top_k, regex=False)
  assert not answer_matching.answer_in_top_k(['1969'], [], regex=False)


def test_recall_at_k_counts_answer_containing_blocks():
  targets = [['Charles Darwin'], ['1969'], ['Mars']]
  retrieved = [['On the Origin of Species was written by Charles Darwin.',
                'x'],
               ['nothing here', 'Apollo 11 landed in July 1969.'],
               ['Venus is hot.', 'Marshmallows']]  # "Mars" is not a word here.
  top = lambda k: [answer_matching.answer_in_top_k(refs, texts[:k], False)
                   for refs, texts in zip(targets, retrieved)]
  assert top(1) == [True, False, False]
  assert top(2) == [True, True, False]
  assert answer_matching.answer_in_top_k(['Feb(ruary)?'],
                                         ['Due on february 3'], regex=True)
