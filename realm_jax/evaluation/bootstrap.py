"""Paired bootstrap confidence intervals for comparing two models.

Both models are scored on the same held-out items (masked-LM queries, QA
questions). Resampling the items with replacement, and scoring both models on
each resample, gives the distribution of the difference with the items'
difficulty shared (Koehn 2004; Berg-Kirkpatrick et al. 2012). A metric is a
ratio of sums, sum(value) / sum(weight): accuracy over masked tokens is
correct tokens over tokens, with one query as the resampled item.
"""

import numpy as np

SAMPLES = 10_000
CHUNK = 500  # Resamples drawn at a time: [CHUNK, items] counts in memory.


def paired_interval(a, b, weights=None, samples: int = SAMPLES,
                    confidence: float = 0.95, seed: int = 0,
                    scale: float = 1.0) -> dict:
  """The difference A - B of a ratio-of-sums metric, with its interval.

  Args:
    a, b: [items] per-item values of the two models (e.g. correct tokens).
    weights: [items] per-item denominators (e.g. masked tokens); default 1.
    samples: bootstrap resamples.
    confidence: two-sided coverage of the percentile interval.
    seed: the resampling seed (fixed: the figures are reproducible).
    scale: multiplies every figure (100 for percentages).

  Returns:
    {'a', 'b', 'difference', 'low', 'high', 'excludes_zero', 'items',
     'samples', 'confidence'}.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  weights = (np.ones_like(a) if weights is None
             else np.asarray(weights, np.float64))
  if not a.shape == b.shape == weights.shape or a.ndim != 1:
    raise ValueError(f'paired_interval needs three equal 1-D arrays, not '
                     f'{a.shape}, {b.shape}, {weights.shape}.')
  items = len(a)
  if not items or weights.sum() <= 0:
    raise ValueError('paired_interval needs items with positive weight.')
  rng = np.random.default_rng(seed)
  differences = []
  for start in range(0, samples, CHUNK):
    counts = rng.multinomial(items, np.full(items, 1 / items),
                             size=min(CHUNK, samples - start))
    total = counts @ weights
    differences.append((counts @ (a - b)) / np.maximum(total, 1e-12))
  differences = scale * np.concatenate(differences)
  tail = 100 * (1 - confidence) / 2
  low, high = np.percentile(differences, [tail, 100 - tail])
  value = lambda x: scale * float(x.sum() / weights.sum())
  return {'a': value(a), 'b': value(b), 'difference': value(a - b),
          'low': float(low), 'high': float(high),
          'excludes_zero': bool(low > 0 or high < 0), 'items': items,
          'samples': samples, 'confidence': confidence}


def describe(interval: dict, digits: int = 1) -> str:
  """'+1.2 [+0.4, +2.0]': the difference and its interval."""
  f = lambda x: f'{x:+.{digits}f}'
  return (f'{f(interval["difference"])} [{f(interval["low"])}, '
          f'{f(interval["high"])}]')
