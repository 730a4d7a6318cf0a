"""seqio's Open-QA metrics, scored as ORQA and REALM score them.

Each takes `(targets, predictions)`: a list of reference lists and a list of
strings. The answer rule itself (normalization, patterns) is
`realm_jax.data.answer_matching`'s, shared with the data loaders and recall.
"""

from typing import Sequence

from realm_jax.data.answer_matching import (compile_answer_pattern,
                                            exact_match_score,
                                            regex_match_score)


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

