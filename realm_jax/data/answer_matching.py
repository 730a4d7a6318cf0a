"""When a text holds an answer: the Open-QA answer rule of ORQA and REALM.

Exact match normalizes both sides the DrQA way (NFD unicode, lowercase, no
punctuation, no a/an/the, collapsed whitespace) and takes the max over the
references. CuratedTREC references are regular expressions, matched
case-insensitively: at the start of a prediction, anywhere in a retrieved
block. A block holds an answer when a normalized reference occurs in it as
whole words (or a pattern matches in it); recall@k counts the questions with
such a block among their top k. Evaluation scores with these, and the data
loaders drop the patterns they cannot compile.
"""

import re
import string
import unicodedata
from typing import Sequence

_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCTUATION = str.maketrans('', '', string.punctuation)


def normalize_answer(text: str) -> str:
  text = unicodedata.normalize('NFD', text).lower()
  text = text.translate(_PUNCTUATION)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def exact_match_score(prediction: str, references: Sequence[str]) -> bool:
  normalized = normalize_answer(prediction)
  return any(normalized == normalize_answer(r) for r in references)


def compile_answer_pattern(pattern: str) -> re.Pattern | None:
  """The compiled CuratedTREC pattern, or None when it is not a valid regex."""
  try:
    return re.compile(pattern, re.IGNORECASE | re.UNICODE)
  except re.error:
    return None


def regex_match_score(prediction: str, patterns: Sequence[str]) -> bool:
  """True when one valid pattern matches at the start of the prediction."""
  for pattern in patterns:
    compiled = compile_answer_pattern(pattern)
    if compiled is not None and compiled.match(prediction):
      return True
  return False


def pattern_found(text: str, patterns: Sequence[str]) -> bool:
  """True when one valid pattern matches anywhere in `text`."""
  compiled = [compile_answer_pattern(p) for p in patterns]
  return any(c is not None and c.search(text) for c in compiled)


def answer_found(normalized: str, references: Sequence[str]) -> bool:
  """True when a reference occurs as whole words in `normalized`: text
  already through `normalize_answer`, a space at each end. One block, or
  every block of a corpus joined, takes the same test."""
  return any(f' {normalize_answer(r)} ' in normalized for r in references
             if normalize_answer(r))


def has_answer(text: str, references: Sequence[str], regex: bool) -> bool:
  """Does a retrieved block contain an answer (string or pattern)?"""
  if regex:
    return pattern_found(text, references)
  return answer_found(f' {normalize_answer(text)} ', references)


def answer_in_top_k(references: Sequence[str], top_k: Sequence[str],
                    regex: bool) -> bool:
  """One question's recall@k: does one of its top-k blocks hold an answer?"""
  return any(has_answer(t, references, regex) for t in top_k)

