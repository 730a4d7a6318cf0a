"""Open-QA metrics, scored as ORQA and REALM score them.

Exact match normalizes both sides the DrQA way (NFD unicode, lowercase, no
punctuation, no a/an/the, collapsed whitespace) and takes the max over the
references. CuratedTREC references are regular expressions matched at the
start of the prediction, case-insensitively. The seqio metric functions take
`(targets, predictions)`: a list of reference lists and a list of strings.
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


def _percent(hits: int, total: int) -> float:
  return 100.0 * hits / total if total else 0.0


def exact_match(targets: Sequence[Sequence[str]],
                predictions: Sequence[str]) -> dict[str, float]:
  """seqio metric: percentage of predictions that exactly match a reference."""
  hits = sum(exact_match_score(p, refs) for p, refs in zip(predictions,
                                                            targets))
  return {'exact_match': _percent(hits, len(predictions))}


def regex_match(targets: Sequence[Sequence[str]],
                predictions: Sequence[str]) -> dict[str, float]:
  """seqio metric for CuratedTREC; also reports how many patterns are invalid."""
  hits = sum(regex_match_score(p, refs) for p, refs in zip(predictions,
                                                            targets))
  invalid = sum(compile_answer_pattern(r) is None
                for refs in targets for r in refs)
  return {'regex_match': _percent(hits, len(predictions)),
          'invalid_patterns': float(invalid)}


def has_answer(text: str, references: Sequence[str], regex: bool) -> bool:
  """Does a retrieved block contain an answer (string or pattern)?"""
  if regex:
    compiled = [compile_answer_pattern(r) for r in references]
    return any(c is not None and c.search(text) for c in compiled)
  haystack = f' {normalize_answer(text)} '
  return any(f' {normalize_answer(r)} ' in haystack for r in references
             if normalize_answer(r))


def answer_recall_at_k(targets: Sequence[Sequence[str]],
                       retrieved_texts: Sequence[Sequence[str]], k: int,
                       regex: bool = False) -> dict[str, float]:
  """Percentage of questions with an answer in one of their top-k blocks."""
  hits = sum(any(has_answer(t, refs, regex) for t in texts[:k])
             for refs, texts in zip(targets, retrieved_texts))
  return {f'recall@{k}': _percent(hits, len(targets))}
