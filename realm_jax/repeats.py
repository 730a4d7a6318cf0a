"""A preset run N times (`realm-jax demo --repeats=N`): each figure's spread.

One run's paired bootstrap interval says how far its held-out queries let
a difference move. It says nothing of a second run from another seed, or,
with the asynchronous index builder, with other timings: what a REALM run
retrieves at a step depends on which index the builder had published by
then. So a figure quoted from a preset is the mean over runs with its
range, and each comparison keeps its interval from every run beside them.
"""

import os
from collections.abc import Callable, Sequence

import numpy as np

from realm_jax.evaluation import bootstrap


def run_dir(work_dir: str, seed: int) -> str:
  return os.path.join(work_dir, f'seed_{seed}')


def intervals(comparisons: dict, prefix: str = '') -> dict[str, dict]:
  """Every paired interval in a results' comparisons, by its path
  ('realm_vs_baseline/masked_token_accuracy')."""
  out = {}
  for key, value in comparisons.items():
    if not isinstance(value, dict):
      continue
    path = f'{prefix}{key}'
    if {'difference', 'low', 'high'} <= value.keys():
      out[path] = value
    else:
      out.update(intervals(value, path + '/'))
  return out


def describe(values: Sequence[float | None]) -> dict:
  """Mean, min and max of the runs that have the figure."""
  present = [float(v) for v in values if v is not None]
  if not present:
    return {'values': list(values), 'mean': None, 'min': None, 'max': None}
  return {'values': list(values), 'mean': float(np.mean(present)),
          'min': min(present), 'max': max(present)}


def spread(runs: list[dict],
           figures: Callable[[dict], dict[str, float | None]]) -> dict:
  """Across `runs` (each a preset's results): each of `figures(results)`
  and each comparison's difference, described; every run's interval
  kept, and how many runs' intervals exclude 0 on the positive side."""
  per_run = [figures(r) for r in runs]
  found = [intervals(r['comparisons']) for r in runs]
  comparisons = {}
  for path in found[0]:
    rows = [f.get(path) for f in found]
    comparisons[path] = {
        **describe([row and row['difference'] for row in rows]),
        'intervals': [row and {k: row[k] for k in
                               ('difference', 'low', 'high')}
                      for row in rows],
        'runs_above_zero': sum(bool(row and row['low'] > 0) for row in rows)}
  return {'runs': len(runs), 'seeds': [r.get('seed') for r in runs],
          'figures': {name: describe([f.get(name) for f in per_run])
                      for name in per_run[0]},
          'comparisons': comparisons}


def _number(x: float | None, digits: int, sign: str = '') -> str:
  return '-' if x is None else f'{x:{sign}.{digits}f}'


def figure_rows(summary: dict, digits: int = 1) -> list[str]:
  """The figures' markdown table: mean, range and every run."""
  seeds = summary['seeds']
  lines = ['| figure | mean | range | ' + ' | '.join(
      f'seed {s}' for s in seeds) + ' |', '|---|---|---|' + '---|' * len(seeds)]
  for name, d in summary['figures'].items():
    lines.append(
        f'| {name} | {_number(d["mean"], digits)} | '
        f'{_number(d["min"], digits)} to {_number(d["max"], digits)} | '
        + ' | '.join(_number(v, digits) for v in d['values']) + ' |')
  return lines


def comparison_rows(summary: dict, labels: dict[str, tuple[str, int]]
                    ) -> list[str]:
  """The comparisons' markdown table, in `labels`' order (path -> label,
  digits): each run's difference and interval, their mean and range, and
  how many runs' intervals lie above 0."""
  seeds = summary['seeds']
  lines = ['| comparison (A - B) | mean | range | ' + ' | '.join(
      f'seed {s} [95% interval]' for s in seeds) + ' | runs above 0 |',
           '|---|---|---|' + '---|' * len(seeds) + '---|']
  for path, (label, digits) in labels.items():
    d = summary['comparisons'].get(path)
    if d is None:
      continue
    shown = ['-' if i is None else bootstrap.describe(i, digits)
             for i in d['intervals']]
    lines.append(
        f'| {label} | {_number(d["mean"], digits, "+")} | '
        f'{_number(d["min"], digits, "+")} to '
        f'{_number(d["max"], digits, "+")} | ' + ' | '.join(shown)
        + f' | {d["runs_above_zero"]} of {summary["runs"]} |')
  return lines
