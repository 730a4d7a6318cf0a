"""When a text holds an answer: the rules by which the field scores Open-QA.

- A predicted answer is right by ORQA's exact match: both sides normalized
  the DrQA way (NFD unicode, lowercase, no punctuation, no a/an/the,
  collapsed whitespace), the max over the references. A CuratedTREC
  prediction is right when a pattern matches at its start.
- A retrieved block holds an answer by DPR's `has_answer`, the rule of
  REALM's recall@5 and of DPR's and Pyserini's top-k accuracy: both sides
  NFD; a reference is found when its uncased tokens occur, consecutively,
  among the block's. Tokens are DPR's SimpleTokenizer's: a run of letters,
  digits and marks is one token, and every other character that is not a
  space (punctuation, symbols) a token of its own. A pattern is found when
  it matches anywhere in the block.

Patterns compile with IGNORECASE | UNICODE | MULTILINE, as ORQA, DPR and
Pyserini compile them; in blocks with the `regex` module, as DPR does. The
data loaders drop the patterns that cannot compile.
"""

import functools
import re
import string
import unicodedata
from typing import Iterable, Mapping, Sequence

import regex

_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCTUATION = str.maketrans('', '', string.punctuation)
_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE
_TOKEN = regex.compile(r'[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]')


def normalize_answer(text: str) -> str:
  text = unicodedata.normalize('NFD', text).lower()
  text = text.translate(_PUNCTUATION)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def exact_match_score(prediction: str, references: Sequence[str]) -> bool:
  normalized = normalize_answer(prediction)
  return any(normalized == normalize_answer(r) for r in references)


def compile_answer_pattern(pattern: str) -> re.Pattern | None:
  """The compiled CuratedTREC pattern, or None when it is not a valid regex
  (a syntax error, a repeat count too large, nesting too deep)."""
  try:
    return re.compile(pattern, _FLAGS)
  except (re.error, OverflowError, RecursionError):
    return None


def regex_match_score(prediction: str, patterns: Sequence[str]) -> bool:
  """True when one valid pattern matches at the start of the prediction."""
  for pattern in patterns:
    compiled = compile_answer_pattern(pattern)
    if compiled is not None and compiled.match(prediction):
      return True
  return False


def answer_tokens(text: str) -> list[str]:
  """DPR's uncased SimpleTokenizer tokens of NFD `text`."""
  return [t.lower() for t in _TOKEN.findall(unicodedata.normalize('NFD',
                                                                  text))]


def _spaced(tokens: Iterable[str]) -> str:
  # Tokens hold no whitespace, so one occurs in a run of them exactly when
  # ' a b ' is a substring of ' x a b y '.
  return ' ' + ' '.join(tokens) + ' '


@functools.lru_cache(maxsize=4096)
def _block_pattern(pattern: str):
  try:
    return regex.compile(unicodedata.normalize('NFD', pattern), _FLAGS)
  except Exception:  # pylint: disable=broad-except
    return None  # DPR counts a pattern that does not compile as no answer.


def has_answer(text: str, references: Sequence[str], is_regex: bool) -> bool:
  """Does a retrieved block hold an answer (string or pattern)? DPR's rule.

  A reference with no tokens at all (blank) is found in every block, as in
  DPR; the loaders never keep one.
  """
  if is_regex:
    return _pattern_in(unicodedata.normalize('NFD', text), references)
  return _tokens_in(_spaced(answer_tokens(text)), references)


def _compiled(patterns: Sequence[str]) -> list:
  return [c for c in map(_block_pattern, patterns) if c is not None]


def _pattern_in(nfd_text: str, patterns: Sequence[str]) -> bool:
  return any(c.search(nfd_text) for c in _compiled(patterns))


def _tokens_in(spaced_text: str, references: Sequence[str]) -> bool:
  for reference in references:
    tokens = answer_tokens(reference)
    if not tokens or _spaced(tokens) in spaced_text:
      return True
  return False


class CorpusAnswers:
  """DPR's rule over the blocks of a corpus, each prepared once: which
  retrieved blocks hold an answer, and whether any block does."""

  def __init__(self, bodies: Mapping[int, str]):
    self._nfd = {i: unicodedata.normalize('NFD', t) for i, t in bodies.items()}
    self._spaced = {i: _spaced(answer_tokens(t)) for i, t in bodies.items()}
    # Every block's tokens joined: a newline between two blocks, which no
    # reference's tokens hold, so no reference is found across two.
    self._all = '\n'.join(self._spaced.values())

  def holds(self, block_id: int, references: Sequence[str],
            is_regex: bool) -> bool:
    if is_regex:
      return _pattern_in(self._nfd[block_id], references)
    return _tokens_in(self._spaced[block_id], references)

  def anywhere(self, references: Sequence[str], is_regex: bool) -> bool:
    """Is an answer in some block? (The answer-in-corpus subset.)"""
    if is_regex:  # Block by block: '^', '$' and '\s' stay inside one.
      compiled = _compiled(references)
      return any(c.search(t) for t in self._nfd.values() for c in compiled)
    return bool(self._spaced) and _tokens_in(self._all, references)
