"""The answer rules on the tricky cases: ORQA's exact match and patterns;
DPR's has_answer, pinned where the old containment rule disagreed with it."""

import unicodedata

import hypothesis
import pytest
import regex
from hypothesis import strategies as st

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
    ('Paris\nFrance', ['^Paris$'], True),                  # MULTILINE.
])
def test_regex_match(prediction, patterns, expected):
  assert answer_matching.regex_match_score(prediction, patterns) is expected


@pytest.mark.parametrize('pattern', ['(unclosed', 'a{99999999999}', '(' * 500
                                     + ')' * 500])
def test_a_pattern_that_cannot_compile_is_none(pattern):
  assert answer_matching.compile_answer_pattern(pattern) is None


# Each kind of case where the old rule (normalize both sides as exact match
# does, then test containment) and DPR's disagreed, some beside a case where
# they agree; the verdict is DPR's.
DISAGREEMENTS = [
    # Articles are tokens: "the President" is not in "a president".
    ('A president was elected.', ['the President'], False),
    ('The president of France', ['the President'], True),
    # Punctuation is a token, not deleted: "C++" is not "C", 11.16 not 1116.
    ('The letter C is round.', ['C++'], False),
    ('Written in C++ and Java.', ['C++'], True),
    ('It cost 1116 dollars.', ['11.16'], False),
    ('It rose 11.16 percent.', ['11.16'], True),
    # Possessives, hyphens, commas and dashes split words into tokens.
    ("Darwin's theory of evolution", ['Darwin'], True),
    ('The Smith-Jones report', ['Jones'], True),
    ('Apollo missions 11,12 and 14', ['12'], True),
    ('The Iran–Iraq War began in 1980.', ['Iraq'], True),
    ('The Iran–Iraq War began in 1980.', ['Iran–Iraq war'], True),
    # An answer that normalizes to nothing is an answer of its own tokens.
    ('The Who played on.', ['The'], True),
    ('Yahoo! was founded in 1994.', ['!'], True),
    ('Yahoo was founded in 1994.', ['!'], False),
]


@pytest.mark.parametrize('text,references,expected', DISAGREEMENTS)
def test_has_answer_is_dpr_s_where_the_old_rule_disagreed(text, references,
                                                         expected):
  assert answer_matching.has_answer(text, references, False) is expected


@pytest.mark.parametrize('text,references,is_regex,expected', [
    ('Written by Charles Darwin.', ['charles darwin'], False, True),
    ('Marshmallows', ['Mars'], False, False),          # Whole tokens only.
    ('Café de Flore', ['CAFÉ'], False, True),          # Uncased, NFD.
    ('Cafe de Flore', ['Café'], False, False),         # Marks stay in a word.
    ('anything at all', [''], False, True),            # No tokens: DPR's True.
    ('anything at all', ['  '], False, True),
    ('Due on february 3', ['Feb(ruary)?'], True, True),  # Anywhere, any case.
    ('x', ['(unclosed'], True, False),                 # Invalid: no answer.
    # MULTILINE: '^' and '$' at each line of a multi-line block.
    ('Capital:\nParis\nFrance', ['^Paris$'], True, True),
    ('Capital: Paris, France', ['^Paris$'], True, False),
    ('Café', ['^cafe\u0301$'], True, True),            # Both sides NFD.
])
def test_has_answer(text, references, is_regex, expected):
  assert answer_matching.has_answer(text, references, is_regex) is expected


def _dpr_has_answer(text, references):
  """DPR's loop, literally: a window of the reference's tokens over the
  text's (its SimpleTokenizer's pattern, uncased, both sides NFD)."""
  tokenize = lambda s: [m.group().lower() for m in regex.finditer(
      r'([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])',
      unicodedata.normalize('NFD', s),
      flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)]
  words = tokenize(text)
  for reference in references:
    answer = tokenize(reference)
    if any(answer == words[i:i + len(answer)]
           for i in range(len(words) - len(answer) + 1)):
      return True
  return False


_TEXT = st.text(alphabet=st.sampled_from(
    list('ab1 -.,\'\n\t') + ['\u00e9', '\u0301', '–', '\u00a0', 'B', 'Ω']),
                max_size=30)


@hypothesis.settings(max_examples=400, derandomize=True, deadline=None)
@hypothesis.given(text=_TEXT, references=st.lists(_TEXT, max_size=3))
def test_has_answer_equals_dpr_s_token_window(text, references):
  assert answer_matching.has_answer(text, references, False) == \
      _dpr_has_answer(text, references)


BLOCKS = {3: 'Zebras have stripes. The zebra', 7: 'Giraffe necks are long.',
          9: 'São Paulo is\nlarge.'}


@pytest.mark.parametrize('references,is_regex', [
    (['zebra'], False), (['sao paulo'], False), (['São Paulo'], False),
    (['zebra giraffe'], False),            # Across two blocks: no answer.
    (['the'], False), (['okapi'], False),
    (['^Giraffe'], True),                  # '^' at a block's start.
    (['^large'], True),                    # ... and at a line's.
    (['zebra\\s+giraffe'], True),          # '\s' does not cross blocks.
    (['(unclosed'], True),
])
def test_the_corpus_index_is_has_answer_block_by_block(references, is_regex):
  corpus = answer_matching.CorpusAnswers(BLOCKS)
  expected = [answer_matching.has_answer(t, references, is_regex)
              for t in BLOCKS.values()]
  assert corpus.holds(list(BLOCKS), references, is_regex) == expected
  assert corpus.holds(list(BLOCKS)[::-1], references, is_regex) == (
      expected[::-1])  # Each block prepared once, whatever the order.
  assert corpus.anywhere([(references, is_regex)]) == [any(expected)]


def test_the_corpus_index_finds_a_block_s_first_and_last_tokens():
  corpus = answer_matching.CorpusAnswers(BLOCKS)
  assert corpus.anywhere([(['Zebras'], False), (['long', '.'], False),
                          (['^Giraffe'], True)]) == [True, True, True]
  assert answer_matching.CorpusAnswers({}).anywhere([([''], False)]) == [
      False]


@hypothesis.settings(max_examples=200, derandomize=True, deadline=None)
@hypothesis.given(
    blocks=st.lists(_TEXT, max_size=4),
    questions=st.lists(st.tuples(st.lists(_TEXT, max_size=3), st.booleans()),
                       max_size=6))
def test_one_pass_over_the_corpus_is_has_answer_in_some_block(blocks,
                                                             questions):
  """Every question at once, strings and patterns mixed, equals asking
  each block in turn (patterns here are literal text, escaped or not)."""
  corpus = answer_matching.CorpusAnswers(dict(enumerate(blocks)))
  calls = []
  found = corpus.anywhere(questions, lambda: calls.append(1))
  assert found == [
      any(answer_matching.has_answer(t, refs, is_regex) for t in blocks)
      for refs, is_regex in questions]
  assert len(calls) == len(blocks)
