"""The figures the README and docs/RESULTS.md quote, made from the record.

The record is docs/results/<preset>.json, which `realm-jax demo --record`
writes. A figure quoted in a document sits in a marked span,

    <!-- record:NAME -->the text<!-- /record -->

and `render` rewrites each span's text from the record (`FIGURES[NAME]`),
so that no quoted number is typed by hand. `python -m realm_jax.record`
rewrites the documents in place; `--check` lists each span whose text is
not what its source gives, and exits 1 (tests/test_record.py runs it).
"""

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Callable

from etils import epath

from realm_jax.evaluation import bootstrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, 'docs', 'results')
DOCUMENTS = ('README.md', os.path.join('docs', 'RESULTS.md'))
SPAN = re.compile(r'<!-- record:([\w.-]+) -->(.*?)<!-- /record -->', re.S)


def load(preset: str, results_dir: str = RESULTS) -> dict:
  return json.loads(
      (epath.Path(results_dir) / f'{preset}.json').read_text())


def _signed(x: float, digits: int = 1) -> str:
  return f'{x:+.{digits}f}'


def verdict(i: dict) -> str:
  if i['low'] > 0:
    return 'above 0'
  return 'below 0' if i['high'] < 0 else 'inside the noise'


def machine(m: dict) -> str:
  """'2 cores of an AMD EPYC (2048^3 float32 matmul 453 GFLOP/s)', or the
  accelerator."""
  if m.get('device'):
    return (f'one {m["device"]} (bfloat16 matmul {m["bf16_matmul_tflops"]:.0f}'
            ' TFLOP/s)')
  return (f'{m["cores"]} cores of an {m["cpu"]} (2048³ float32 matmul '
          f'{m["matmul_2048_gflops"]:.0f} GFLOP/s)')


def provenance(runs: int, m: dict, minutes: float) -> str:
  run = '1 run' if runs == 1 else f'the mean of {runs} runs'
  return (f'{run}, commit {m.get("commit") or "not recorded"}, on '
          f'{machine(m)}, {minutes:.1f} minutes a run')


def world_table(results_dir: str = RESULTS) -> str:
  """The world preset's headline figures over its runs."""
  from realm_jax.experiments import world_report  # pylint: disable=g-import-not-at-top
  record = load('world', results_dir)
  summary, first = record['repeats'], record['runs'][0]
  figures, compared = summary['figures'], summary['comparisons']
  runs = summary['runs']
  value = lambda d: f'{d["mean"]:.1f} ({d["min"]:.1f} to {d["max"]:.1f})'
  minutes = figures['whole preset (minutes)']['mean']
  lines = [f'| `realm-jax demo --preset=world`: '
           f'{provenance(runs, first["machine"], minutes)} | mean (range) |',
           '|---|---|']
  lines += [f'| {name} | {value(d)} |' for name, d in figures.items()
            if name != 'whole preset (minutes)']
  for path in ('realm_vs_frozen/recall@1', 'realm_vs_stale/recall@1',
               'realm_vs_stale_along/masked_token_accuracy',
               'realm_vs_baseline/masked_token_accuracy'):
    d, (label, _) = compared[path], world_report.COMPARISONS[path]
    lines.append(f'| {label}, A - B | {_signed(d["mean"])} '
                 f'({_signed(d["min"])} to {_signed(d["max"])}); the '
                 f'interval above 0 in {d["runs_above_zero"]} of {runs} |')
  return '\n'.join(lines)


def _world_figure(results_dir: str, name: str, preset: str = 'world'
                  ) -> dict:
  """One of a world preset's figures over its runs: mean, min, max."""
  return load(preset, results_dir)['repeats']['figures'][name]


def _over_runs(results_dir: str, preset: str, name: str) -> str:
  """'99.8% (99.5 to 100.0), the mean of 3 runs'."""
  figure = _world_figure(results_dir, name, preset)
  runs = load(preset, results_dir)['repeats']['runs']
  return (f'{figure["mean"]:.1f}% ({figure["min"]:.1f} to '
          f'{figure["max"]:.1f}), the mean of {runs} runs')


def world_comparisons(results_dir: str = RESULTS) -> str:
  """Every comparison of the world preset, each run's interval beside
  the mean and range."""
  from realm_jax import repeats  # pylint: disable=g-import-not-at-top
  from realm_jax.experiments import world_report  # pylint: disable=g-import-not-at-top
  summary = load('world', results_dir)['repeats']
  return '\n'.join(repeats.comparison_rows(summary, world_report.COMPARISONS))


def world_along(results_dir: str = RESULTS) -> str:
  """REALM and the stale run of each seed, scored at each quarter of
  their training."""
  from realm_jax.experiments import world_report  # pylint: disable=g-import-not-at-top
  names = {'realm': 'REALM', 'stale': f'{world_report.STALE_FACTOR}x stale'}
  points = {f'seed {r["seed"]}: {names[n]}': p
            for r in load('world', results_dir)['runs']
            for n, p in world_report.along_points(r['held_out']).items()}
  return '\n'.join(world_report.along_table(points))


def world_levers(results_dir: str = RESULTS) -> str:
  """The world's figures as each lever came: the top 3, the top 7 (the
  paper's 8 candidates, the null document included), then REALM's warmup
  over 100 steps instead of 30, each over its runs."""
  loaded = [(preset, load(preset, results_dir))
            for preset in ('world_top3', 'world_warmup30', 'world')]
  records = [(preset, r['repeats']) for preset, r in loaded]
  value = lambda d: (f'{d["mean"]:.1f} ({d["min"]:.1f} to {d["max"]:.1f})'
                     if d['mean'] is not None else '-')
  lines = ['| figure, mean (range) | ' + ' | '.join(
      f'{p["runs"]} runs of `{name}`' for name, p in records) + ' |',
           '|---|' + '---|' * len(records)]
  for name in records[0][1]['figures']:
    lines.append(f'| {name} | ' + ' | '.join(
        value(p['figures'][name]) for _, p in records) + ' |')
  # The minutes are each record's machine's: its matmul rate beside them.
  rates = (f'{r["runs"][0]["machine"]["matmul_2048_gflops"]:.0f}'
           for _, r in loaded)
  lines.append('| 2048³ float32 matmul (GFLOP/s), the first run | '
               + ' | '.join(rates) + ' |')
  return '\n'.join(lines)


def _runs_and_minutes(r: dict) -> tuple[int, float]:
  """How many runs a demo preset's record holds, and their mean minutes."""
  if 'repeats' in r:
    return (r['repeats']['runs'],
            r['repeats']['figures']['whole preset (minutes)']['mean'])
  from realm_jax.experiments import runner  # pylint: disable=g-import-not-at-top
  return 1, runner.wall_seconds(r) / 60


def demo_table(results_dir: str = RESULTS, preset: str = 'demo') -> str:
  """The demo's two core checks, each with its paired interval (over
  runs: their mean, range and every run's interval)."""
  from realm_jax import repeats
  from realm_jax.experiments import demo_report  # pylint: disable=g-import-not-at-top
  r = load(preset, results_dir)
  c = r['comparisons']
  runs, minutes = _runs_and_minutes(r)
  if runs > 1:
    core = ('masked_lm/realm_vs_baseline/masked_token_accuracy',
            'recall/realm_vs_ict/recall@5_answer_in_corpus')
    return '\n'.join(
        [f'`realm-jax demo --preset={preset}`: '
         f'{provenance(runs, r["machine"], minutes)}.', ''] +
        repeats.comparison_rows(r['repeats'],
                                {p: demo_report.COMPARISONS[p] for p in core}))
  rows = [('held-out masked accuracy (%): REALM vs the trained baseline',
           c['masked_lm']['realm_vs_baseline']['masked_token_accuracy'], 2)]
  if 'recall' in c:
    rows.append(('NQ recall@5 (%): REALM vs its ICT start',
                 c['recall']['realm_vs_ict']['recall@5'], 2))
  lines = [f'| `realm-jax demo --preset={preset}`: '
           f'{provenance(runs, r["machine"], minutes)} | A | B | '
           'A - B [95% interval] | |', '|---|---|---|---|---|']
  lines += [f'| {label} | {i["a"]:.{d}f} | {i["b"]:.{d}f} | '
            f'{bootstrap.describe(i, d)} | {verdict(i)} |' for label, i, d in rows]
  return '\n'.join(lines)


def _comparison(preset: str, path: str, digits: int = 2,
                results_dir: str = RESULTS) -> str:
  c = load(preset, results_dir)['comparisons']
  for key in path.split('/'):
    c = c[key]
  return bootstrap.describe(c, digits)


def comparisons(preset: str, results_dir: str = RESULTS) -> str:
  """A demo preset's comparisons table, as its own report gives it."""
  from realm_jax import repeats
  from realm_jax.experiments import demo_report  # pylint: disable=g-import-not-at-top
  r = load(preset, results_dir)
  if 'repeats' in r:
    return '\n'.join(repeats.comparison_rows(r['repeats'],
                                             demo_report.COMPARISONS))
  return '\n'.join(demo_report.comparison_rows(r))


def fine_tuning(results_dir: str = RESULTS) -> str:
  """The end-to-end preset's fine-tuning comparisons and their cost."""
  from realm_jax.experiments import demo_report  # pylint: disable=g-import-not-at-top
  r = load('end_to_end', results_dir)
  lines = demo_report.end_to_end_markdown(r, r['sizes'])
  return '\n'.join(lines[lines.index('') + 3:])  # From its text on.


def preset_provenance(preset: str, results_dir: str = RESULTS) -> str:
  r = load(preset, results_dir)
  runs, minutes = _runs_and_minutes(r)
  return provenance(runs, r['machine'], minutes)


def stage_times(preset: str, results_dir: str = RESULTS) -> str:
  """A run's wall time, its stages' sum, and the stages its budget cut."""
  from realm_jax.experiments import demo_report, runner  # pylint: disable=g-import-not-at-top
  r = load(preset, results_dir)
  cut = demo_report.cut_stages(r, r['sizes'])
  return (f'{runner.wall_seconds(r):.0f} s of stages ('
          f'{sum(r["timings"].values()):.0f} s one after another)'
          + ('; the budget stopped ' + ', '.join(
              f'{name} at step {reached:,} of {asked:,}'
              for name, reached, asked in cut) if cut else ''))


DEMO_PRESETS = ('demo', 'reproduce', 'end_to_end', 'gpu')
FIGURES: dict[str, Callable[[str], str]] = {
    **{f'{p}.comparisons': functools.partial(comparisons, p)
       for p in DEMO_PRESETS},
    **{f'{p}.provenance': functools.partial(preset_provenance, p)
       for p in DEMO_PRESETS},
    'end_to_end.fine_tuning': fine_tuning,
    'world.table': world_table,
    'world.comparisons': world_comparisons,
    'world.levers': world_levers,
    'world.along': world_along,
    'demo.table': demo_table,
    'gpu.table': lambda d: demo_table(d, 'gpu'),
    'gpu.stages': functools.partial(stage_times, 'gpu'),
    'demo.blocks': lambda d: f'{load("demo", d)["corpus"]["num_blocks"]:,}',
    'world.recall': lambda d: (
        f'{_world_figure(d, "held-out recall@1 of REALM (%)")["mean"]:.1f}%'),
    'world_pdist.recall': lambda d: _over_runs(
        d, 'world_pdist', 'held-out recall@1 of REALM (%)'),
    'world_pdist.accuracy': lambda d: _over_runs(
        d, 'world_pdist', 'held-out fill accuracy of REALM (%)'),
    # One paired interval of a record: REALM's two core checks of each
    # preset that makes them, and the successors' signals beside REALM.
    **{f'{preset}.{name}': functools.partial(
        lambda preset, path, d: _comparison(preset, path, results_dir=d),
        preset, path)
       for preset, name, path in (
           *((p, n, c) for p in ('demo', 'gpu') for n, c in (
               ('accuracy',
                'masked_lm/realm_vs_baseline/masked_token_accuracy'),
               ('recall', 'recall/realm_vs_ict/recall@5_answer_in_corpus'))),
           ('signals', 'realm_recall',
            'recall/realm_vs_ict/recall@5_answer_in_corpus'),
           ('signals', 'pdist_recall',
            'recall/pdist_vs_ict/recall@5_answer_in_corpus'),
           ('signals', 'pdist_accuracy',
            'masked_lm/pdist_vs_realm/masked_token_accuracy'))},
}


def render(text: str, results_dir: str = RESULTS) -> str:
  """`text` with every marked span's text made from the record."""
  def replace(match):
    name = match.group(1)
    if name not in FIGURES:
      raise KeyError(f'No figure named {name!r} (realm_jax/record.py); '
                     f'the figures: {", ".join(sorted(FIGURES))}.')
    made = FIGURES[name](results_dir)
    if '\n' in made:
      made = f'\n{made}\n'
    return f'<!-- record:{name} -->{made}<!-- /record -->'
  return SPAN.sub(replace, text)


def stale(text: str, results_dir: str = RESULTS) -> list[str]:
  """The names of the spans whose text is not what the record gives."""
  made = dict((m.group(1), m.group(2))
              for m in SPAN.finditer(render(text, results_dir)))
  return [m.group(1) for m in SPAN.finditer(text)
          if m.group(2) != made[m.group(1)]]


# A measured figure in prose: a decimal, a percentage, a ratio, a number
# with a unit of time, size, rate or loss (the unit may follow on the next
# line), or a count with thousands separators ('25,040 blocks').
_NUMBER = r'(?<![\w.])(?<![A-Za-z]-)'  # Not inside a word, nor 'Apache-2.0'.
_FIGURE = re.compile(
    _NUMBER + r'\d[\d,]*(\.\d+)?(?:[ \t]?|\n[ \t]*)(%|×|x\b|min\b|'
    r'minutes\b|s\b|ms\b|seconds\b|hours?\b|GiB\b|MiB\b|GB\b|MB\b|'
    r'[GT]FLOP/s|points\b|nats?\b)|' + _NUMBER + r'\d+\.\d+(?![\w.])|'
    + _NUMBER + r'\d{1,3}(?:,\d{3})+(?![\d.])')
# Settings, not measurements: a 95% interval, a 30x stale index, a goal
# ('at most 10 minutes').
_SETTING = re.compile(r'\s(interval|stale)')
_GOAL = re.compile(r'(at most|within|under)\s+$')
# A fenced block is quoted as it is when it is code (its fence names a
# language) or an example's output marked as such just above it; any other
# (a run's output, shown bare) holds figures like prose.
_FENCE = re.compile(r'(<!-- example output[^\n]*-->\n)?```(\w*)\n.*?```', re.S)
_QUOTED = re.compile(r'`[^`]+`|\]\([^)]*\)|<!--.*?-->', re.S)


def untraced(text: str) -> list[str]:
  """The measured figures in `text` outside any marked span (and outside
  code, marked examples' output, links' targets and comments), by line."""
  blank = lambda m: re.sub(r'[^\n]', ' ', m.group(0))
  text = SPAN.sub(lambda m: ' ' * len(m.group(0)), text)
  text = _FENCE.sub(lambda m: blank(m) if m.group(1) or m.group(2) else
                    re.sub(r'```', '   ', m.group(0)), text)
  text = _QUOTED.sub(blank, text)
  found = []
  for m in _FIGURE.finditer(text):
    before = text[text.rfind('\n', 0, m.start()) + 1:m.start()]
    if _SETTING.match(text, m.end()) or _GOAL.search(before):
      continue
    line = text.count('\n', 0, m.start()) + 1
    found.append(f'line {line}: {m.group(0)!r}')
  return found


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true',
                      help='List the stale figures and exit 1 if any.')
  args = parser.parse_args(argv)
  found = []
  for name in DOCUMENTS:
    path = epath.Path(REPO) / name
    text = path.read_text()
    if args.check:
      found += [f'{name}: {figure}' for figure in stale(text)]
    else:
      path.write_text(render(text))  # Made whole before it is written.
  for line in found:
    print(f'stale figure, not what docs/results gives: {line}')
  return 1 if found else 0


if __name__ == '__main__':
  sys.exit(main())
