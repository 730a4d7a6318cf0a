"""The report of the world's presets: the goals, the comparisons
(`world_demo.finish`) as tables, the edit check and the held-out scores
as markdown, the curves as world.png, written to the work_dir and the
record. Apart from the stages (`world_demo`), so that what reads results
alone (`record`, the repeats) needs none of the stages' code, and
neither module outgrows one concern."""

import json
import os

from etils import epath

from realm_jax import repeats
from realm_jax.evaluation import bootstrap
from realm_jax.experiments import runner
from realm_jax.experiments.presets._world import STALE_FACTOR

ICT_WHY = (
    "ICT's pseudo-queries are the documents' own sentences, which name the "
    'person by first name alone (but the first): it teaches the towers to '
    'match names, not which of the people who share a first name a query '
    'is about. With random towers, the first retrieved block is the right '
    'one for 1% of queries and no signal reaches the retriever.')
REFRESH_MODES = {
    'async': 'as soon as the builder can (the paper\'s asynchronous refresh)',
    'lockstep': 'on a fixed schedule (lockstep): step s reads the index of '
                'the last multiple of the interval before the current one, '
                'waited for if the builder is late'}
LOCKSTEP_WHY = (
    'With the asynchronous builder, a REALM step retrieves from whichever '
    'index the builder had published by then, so two runs of one seed '
    'differ with the load on the machine. With `--lockstep`, step s '
    'retrieves from the index of step {i} (floor(s / {i}) - 1), waited for '
    'if late: each run depends on its seed alone. The {f}x stale run then '
    'serves its first index until step {stale}.')
READER_WHY = (
    'The paper starts its reader from BERT, which already reads. A small '
    'BERT trained from nothing copies a value out of a block only after '
    'many steps; the warm start teaches it on the training queries with '
    'their own document (the trivial candidate REALM excludes), which '
    'leaves the retriever untouched and tells it nothing about held-out '
    'people.')


# The comparisons' paths in `world_demo.comparisons` -> (label, digits), as
# reported.
COMPARISONS = {
    'realm_vs_baseline/masked_token_accuracy': (
        'held-out fill accuracy (%): REALM vs the no-retrieval baseline', 1),
    'realm_vs_prior/masked_token_accuracy': (
        'held-out fill accuracy (%): REALM vs the value prior', 1),
    'baseline_vs_prior/masked_token_accuracy': (
        'held-out fill accuracy (%): the baseline vs the value prior', 1),
    'realm_vs_start/recall@1': (
        "held-out recall@1 of the person's document (%): REALM vs its start",
        1),
    'realm_vs_start/masked_token_accuracy': (
        'held-out fill accuracy (%): REALM vs its start', 1),
    'realm_vs_frozen/recall@1': (
        "held-out recall@1 of the person's document (%): REALM vs the "
        'frozen retriever', 1),
    'realm_vs_frozen/masked_token_accuracy': (
        'held-out fill accuracy (%): REALM vs the frozen retriever', 1),
    'realm_vs_stale/recall@1': (
        f'held-out recall@1 (%): fresh vs {STALE_FACTOR}x stale index', 1),
    'realm_vs_stale/masked_token_accuracy': (
        f'held-out fill accuracy (%): fresh vs {STALE_FACTOR}x stale index',
        1),
    'realm_vs_stale_along/recall@1': (
        f'held-out recall@1 (%), the mean over each quarter of training: '
        f'fresh vs {STALE_FACTOR}x stale index', 1),
    'realm_vs_stale_along/masked_token_accuracy': (
        'held-out fill accuracy (%), the mean over each quarter of training: '
        f'fresh vs {STALE_FACTOR}x stale index', 1),
    'p_null/interval': (
        'p(null | x): people without a document vs with one', 3),
}

GOALS = {'held_out_accuracy': 80.0, 'baseline_to_prior': 2.0,
         'recall@1': 90.0, 'edited': 90.0, 'minutes': 10.0}


def figures(results: dict) -> dict[str, float | None]:
  """A run's headline figures: what the goals and the README quote."""
  held, c = results['held_out'], results['comparisons']
  templates = c['recall@1_by_template'].get('realm') or [None, None]
  edit = results.get('edit')
  percent = lambda x: None if x is None else 100 * x
  return {
      'held-out fill accuracy of REALM (%)': percent(
          held['realm']['masked_token_accuracy']),
      'held-out recall@1 of REALM (%)': percent(held['realm']['recall@1']),
      'recall@1, template 1 (%)': percent(templates[0]),
      'recall@1, template 2 (%)': percent(templates[1]),
      'edited facts answered with the new value (%)': percent(
          edit and edit['answered_new_value']),
      'whole preset (minutes)': runner.wall_seconds(results) / 60}


# Goals on comparisons: path -> label.
COMPARISON_GOALS = {
    'baseline_vs_prior/masked_token_accuracy':
        '|baseline - value prior| (points)',
    'realm_vs_frozen/recall@1': 'frozen retriever below on recall@1',
    'realm_vs_stale/recall@1': f'{STALE_FACTOR}x stale below fresh on recall@1',
    'realm_vs_stale/masked_token_accuracy':
        f'{STALE_FACTOR}x stale below fresh on accuracy',
    'realm_vs_stale_along/recall@1':
        f'{STALE_FACTOR}x stale below fresh on recall@1, along training',
    'realm_vs_stale_along/masked_token_accuracy':
        f'{STALE_FACTOR}x stale below fresh on accuracy, along training'}
# Goals on the figures above: (figure, target, met).
FIGURE_GOALS = (
    ('held-out fill accuracy of REALM (%)', '>= 80',
     lambda v: v >= GOALS['held_out_accuracy']),
    ('held-out recall@1 of REALM (%)', '>= 90',
     lambda v: v >= GOALS['recall@1']),
    ('edited facts answered with the new value (%)', '>= 90',
     lambda v: v >= GOALS['edited']),
    ('whole preset (minutes)', '<= 10', lambda v: v <= GOALS['minutes']))


def _row(label: str, interval: dict | None, digits: int = 1) -> str:
  if interval is None:
    return f'| {label} | not run | | | |'
  verdict = ('interval excludes 0' if interval['excludes_zero'] else
             'inside the noise: interval includes 0')
  f = lambda x: f'{x:.{digits}f}'
  return (f'| {label} | {f(interval["a"])} | {f(interval["b"])} | '
          f'{bootstrap.describe(interval, digits)} | {verdict} |')


def goal_rows(values: dict[str, float | None], compared: dict[str, dict]
              ) -> list[str]:
  """The goals' table: `values` of `figures` (one run's, or the mean over
  runs), and the comparisons of `COMPARISON_GOALS` (each interval, or each
  run's `repeats` summary: then every run's interval must lie above 0)."""
  lines = ['| goal | measured | target | |', '|---|---|---|---|']
  row = lambda label, value, goal, met: (
      f'| {label} | {"-" if value is None else f"{value:.1f}"} | {goal} | '
      f'{"met" if met else "missed"} |')
  for name, target, met in FIGURE_GOALS:
    value = values.get(name)
    lines.append(row(name, value, target, value is not None and met(value)))
  for path, label in COMPARISON_GOALS.items():
    d = compared.get(path)
    if d is None:
      lines.append(row(label, None, '> 0', False))
      continue
    value = d.get('difference', d.get('mean'))
    if path.startswith('baseline_vs_prior'):
      lines.append(row(label, abs(value), '<= 2',
                       abs(value) <= GOALS['baseline_to_prior']))
    else:
      above = (d['runs_above_zero'] == len(d['intervals'])
               if 'intervals' in d else d['low'] > 0)
      lines.append(row(label, value, '> 0, interval above 0', above))
  return lines


def _edit_markdown(edit: dict | None) -> list[str]:
  if not edit:
    return []
  return [
      '', '## The edit check', '',
      f'{edit["people_edited"]} held-out people\'s documents were replaced '
      'with one fact changed (`corpus remove`, `corpus add`; the index '
      f'synced by embedding the {edit["blocks_added"]} new blocks alone, '
      f'{edit["index_sync_seconds"]:.1f} s), and their changed facts asked '
      f'again by the REALM model of step {edit["model_step"]}, no training '
      'step between:', '',
      f'- answered with the new value: {100 * edit["answered_new_value"]:.1f}%'
      f'; with the old value: {100 * edit["answered_old_value"]:.1f}%;',
      f'- the new document retrieved first: '
      f'{100 * edit["recall@1_new_document"]:.1f}%.', '']


def along_points(held: dict) -> dict[str, dict[int, dict]]:
  """Each run scored along its training (`world_demo.score_along`): step
  -> its held-out scores, the last step's included."""
  return {name: {**{int(s): v for s, v in row['along'].items()},
                 row['step']: row}
          for name, row in held.items() if row.get('along')}


def along_table(points: dict[str, dict[int, dict]]) -> list[str]:
  """`along_points` (of one run or several) as a table: a row per step,
  accuracy / recall@1 (%) in each column."""
  cell = lambda v: ('-' if v is None else
                    f'{100 * v["masked_token_accuracy"]:.1f} / '
                    f'{100 * v["recall@1"]:.1f}')
  steps = sorted({s for p in points.values() for s in p})
  return ['| step | ' + ' | '.join(points) + ' |',
          '|---|' + '---|' * len(points),
          *(f'| {s} | ' + ' | '.join(cell(p.get(s)) for p in points.values())
            + ' |' for s in steps)]


def _along_lines(held: dict) -> list[str]:
  points = along_points(held)
  if not points:
    return []
  return ['', 'Held-out accuracy / recall@1 (%) along training, each step '
          'scored with the corpus embedded by its own towers:', '',
          *along_table(points)]


def markdown(results: dict) -> str:
  c = results['comparisons']
  spec, sizes, m = results['spec'], results['sizes'], results['machine']
  held = results['held_out']
  edit = results.get('edit')
  intervals = repeats.intervals(c)
  lines = [
      '# realm-jax `world`: REALM in a controlled knowledge world', '',
      f'Machine: {m["cpu"]}, {m["cores"]} cores, 2048^3 float32 matmul '
      f'{m["matmul_2048_gflops"]} GFLOP/s in JAX. Commit: '
      f'{m.get("commit") or "not recorded"}. Whole preset: '
      f'{runner.wall_seconds(results) / 60:.1f} minutes.', '',
      f'The world (`realm_jax/data/world.py`, seed {spec["seed"]}): '
      f'{spec["people"]:,} people with a document, '
      f'{spec["held_out_share"]:.0%} of them held out (their documents are '
      'in the corpus, their facts never queried in training), '
      f'{spec["no_document"]} people without one; attributes '
      f'{", ".join(spec["attributes"])}, {spec["values"]} values each, drawn '
      'with skewed frequencies; first names shared by about '
      f'{spec["people"] // spec["first_names"]} people each; each document '
      f'names {spec["mentions"]} other person. Every BERT is 2 layers, 128 '
      'wide, from random weights (gin/setups/world.gin).', '',
      f'Stages: ICT {sizes["ict_steps"]} steps of batch 64; the reader\'s '
      f'warm start {sizes["reader_steps"]} steps of batch 32; then REALM '
      f'{sizes["pretrain_steps"]} steps of batch {sizes["batch_size"]}, '
      f'the null document and the top {sizes.get("candidates", 4) - 1}, '
      f'the rate warmed up over {sizes.get("warmup_steps", 30)} steps, '
      'the index builder beside the '
      f'trainer re-embedding a checkpoint every {sizes["refresh_interval"]} '
      f'steps (the stale run: every {sizes["refresh_interval"] * STALE_FACTOR}'
      f'), {REFRESH_MODES[results.get("refresh", "async")]}. Seed '
      f'{results.get("seed", 0)}. The baseline (the null document alone) '
      'and the frozen retriever train for the same steps from the same warm starts; the start is the '
      'same run trained for no step.', '',
      f'Why ICT: {ICT_WHY}', '', f'Why the reader\'s warm start: {READER_WHY}',
      '',
      'Every row is A - B on the same held-out queries (every held-out fact '
      'in each of the 2 query templates) with a paired bootstrap 95% '
      f'interval ({bootstrap.SAMPLES:,} resamples).', '',
      '| comparison | A | B | A - B [95% interval] | verdict |',
      '|---|---|---|---|---|',
      *(_row(label, intervals.get(path), digits)
        for path, (label, digits) in COMPARISONS.items()),
      *_edit_markdown(edit),
      '## Goals', '', *goal_rows(figures(results), intervals),
      '', '## Held-out scores', '',
      '| model | queries | accuracy (%) | recall@1 (%) | -log p(y\\|x) | '
      'retrieval utility | mean p(null) |', '|---|---|---|---|---|---|---|']
  for name, row in held.items():
    f = lambda x, d=1: '-' if x is None else f'{x:.{d}f}'
    lines.append(
        f'| {name} | {row["queries"]:,} | '
        f'{f(100 * row["masked_token_accuracy"])} | '
        f'{f(row["recall@1"] and 100 * row["recall@1"])} | '
        f'{f(row["loss"], 3)} | {f(row["retrieval_utility"], 3)} | '
        f'{f(row["p_null"], 3)} |')
  lines += _along_lines(held)
  by_template = c['recall@1_by_template'].items()
  lines += ['', 'Held-out recall@1 (%) by query template (the first names '
            'the person after a phrase, the second starts with the name):',
            '', '| model | ' + ' | '.join(
                f'template {t + 1}' for t in range(2)) + ' |', '|---|---|---|']
  lines += [f'| {name} | ' + ' | '.join(f'{100 * v:.1f}' for v in values)
            + ' |' for name, values in by_template if values]
  lines += ['', 'Over training (world.png): held-out recall@1 and fill '
            f'accuracy every {sizes["eval_every"]} steps, on the same 128 '
            'held-out queries, with the index the trainer was reading (the '
            'scores above embed the corpus with the last step\'s towers).',
            '',
            '## Time per stage (s)', '', *runner.time_lines(results)]
  return '\n'.join(lines)


def plot(results: dict, png_path: str) -> None:
  """Held-out recall@1 and fill accuracy of each run over its steps, as
  the trainer evaluated them (`world_demo.held_out_curve`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  figure, axes = plt.subplots(1, 2, figsize=(10, 3.5))
  colors = dict(zip(results['curves'], plt.rcParams['axes.prop_cycle']))
  for axis, metric in zip(axes, ('recall@1', 'accuracy')):
    for name, curve in results['curves'].items():
      points = sorted((int(step), value)
                      for step, value in curve[metric].items())
      if points:
        axis.plot(*zip(*[(s, 100 * v) for s, v in points]), marker='.',
                  label=name, **colors[name])
    axis.set_xlabel('step')
    axis.set_ylabel(f'held-out {metric} (%)')
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend()
  figure.tight_layout()
  figure.savefig(png_path, dpi=100)
  plt.close(figure)


def report(results: dict, work_dir: str, docs_dir: str | None = None,
           text: str | None = None, record: dict | None = None) -> None:
  """RESULTS.md, results.json and world.png (of `results`) in work_dir;
  with `docs_dir` (`demo --record`) also <preset>.{md,json,png} there, the
  record. `text` and `record`: what to write instead of `results`' own
  report (`world_demo.run_repeats`')."""
  text = text or markdown(results)
  outputs = [(epath.Path(work_dir), 'RESULTS.md', 'results.json',
              'world.png')]
  if docs_dir is not None:
    preset = results['preset']
    outputs.append((epath.Path(docs_dir), f'{preset}.md', f'{preset}.json',
                    f'{preset}.png'))
  for out, md, js, png in outputs:
    (out / md).write_text(text)
    (out / js).write_text(json.dumps(record or results, indent=2))
    plot(results, os.fspath(out / png))
  print('\n' + text)
