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
from typing import Callable, Iterable, Mapping, Sequence

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
  return _spaced_in(spaced_text, _spaced_references(references))


def _spaced_references(references: Sequence[str]) -> list[str]:
  # A reference of no tokens becomes '', which is in every text.
  return [_spaced(tokens) if tokens else ''
          for tokens in map(answer_tokens, references)]


def _spaced_in(spaced_text: str, spaced_references: Sequence[str]) -> bool:
  return any(r in spaced_text for r in spaced_references)


class CorpusAnswers:
  """DPR's rule over the blocks of a corpus: which retrieved blocks hold an
  answer (`holds`, a block prepared when first asked about), and which
  questions have an answer in some block (`anywhere`, one pass over the
  corpus for every question at once)."""

  def __init__(self, bodies: Mapping[int, str]):
    self._bodies = bodies
    self._spaced, self._normalized = {}, {}

  def holds(self, block_ids: Sequence[int], references: Sequence[str],
            is_regex: bool) -> list[bool]:
    """Does each of `block_ids` hold one of the references? The references
    are tokenized or compiled once for all the blocks."""
    if is_regex:
      compiled = _compiled(references)
      return [any(c.search(self._nfd(i)) for c in compiled)
              for i in block_ids]
    spaced = _spaced_references(references)
    return [_spaced_in(self._spaced_tokens(i), spaced) for i in block_ids]

  def _spaced_tokens(self, block_id: int) -> str:
    if block_id not in self._spaced:  # Decoded and tokenized once.
      self._spaced[block_id] = _spaced(answer_tokens(self._bodies[block_id]))
    return self._spaced[block_id]

  def _nfd(self, block_id: int) -> str:
    if block_id not in self._normalized:  # Decoded and normalized once.
      self._normalized[block_id] = unicodedata.normalize(
          'NFD', self._bodies[block_id])
    return self._normalized[block_id]

  def anywhere(self, questions: Sequence[tuple[Sequence[str], bool]],
               on_block: Callable[[], None] = lambda: None) -> list[bool]:
    """For each question's (references, is_regex): is an answer in some
    block? (The answer-in-corpus subset.) `on_block` follows each block.

    A string is found where its tokens occur consecutively in one block's:
    the block's tokens are looked up by their first token and length, so
    a pass costs about one lookup a token, whatever the number of
    questions. A pattern is searched block by block ('^', '$' and '\\s'
    stay inside one), until it is found.
    """
    found = [False] * len(questions)
    strings = []  # (question, its references' token tuples)
    # first token -> length -> the references' token tuples.
    wanted: dict[str, dict[int, set]] = {}
    patterns = {}  # question -> its compiled patterns, until one is found
    for q, (references, is_regex) in enumerate(questions):
      if is_regex:
        patterns[q] = _compiled(references)
        continue
      tuples = [tuple(answer_tokens(r)) for r in references]
      strings.append((q, tuples))
      for t in filter(None, tuples):
        wanted.setdefault(t[0], {}).setdefault(len(t), set()).add(t)
    patterns = {q: c for q, c in patterns.items() if c}
    seen = set()
    for text in self._bodies.values():
      if wanted:
        tokens = answer_tokens(text)
        for i, token in enumerate(tokens):
          for length, tuples in wanted.get(token, {}).items():
            window = tuple(tokens[i:i + length])
            if window in tuples:
              seen.add(window)
      if patterns:
        nfd = unicodedata.normalize('NFD', text)
        for q in [q for q, compiled in patterns.items()
                  if any(c.search(nfd) for c in compiled)]:
          found[q] = True
          del patterns[q]
      on_block()
    if not self._bodies:
      return found
    for q, tuples in strings:
      # A reference with no tokens is found in every block, as in DPR.
      found[q] = any(not t or t in seen for t in tuples)
    return found
