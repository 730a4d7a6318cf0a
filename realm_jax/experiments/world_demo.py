"""`realm-jax demo --preset=world`: REALM's claims in a controlled world: the
stage kinds (the world's data generator, REALM with its builder, the
scores, the edit check), comparisons and report of the world's presets,
whose stages `presets/_world.py` lists and `runner` runs.

On the real miniature REALM's gain in accuracy stays inside its noise
(docs/RESULTS.md). In the knowledge world of `data.world` each fact is in
exactly one document, so the four claims of the paper can be shown on 2
cores, through the real trainer, the index builder as a separate process
and the living corpus:

1. the retriever learns from the masked-LM signal alone: REALM against the
   same run with its towers frozen at their start, and against its start
   (the two warm starts and the ICT index, trained for no step);
2. a fresh index beats a stale one: against the index re-embedded 30x
   less often;
3. retrieval fills in facts never trained on: held-out people's facts,
   against the no-retrieval baseline and the value prior;
4. changing the corpus changes the answers with no training step: held-out
   documents edited by `corpus remove` and `corpus add`, the index synced.

Stages, each a marker in work_dir/stages as in the demo:
- world: the corpus and query arrays (`world.write`);
- ict: the Inverse Cloze Task warm start of both towers, on the world's
  documents (the paper's retriever start; see `ICT_WHY`);
- reader: the reader's warm start, reading each training query's own
  document (see `READER_WHY`); the retriever is untouched by it;
- pretrain_realm, pretrain_stale (index builder beside the trainer),
  pretrain_frozen (towers frozen) and pretrain_baseline (null document
  alone), all from the same two warm starts for the same steps, and
  pretrain_start, the same run for no step;
- scoring of the held-out queries, the people without a document, and
  the edit check.
The report is work_dir/RESULTS.md with results.json and world.png; with
`realm-jax demo --record`, docs/results/world.{md,json,png} too.
"""

import dataclasses
import json
import os
import tempfile

import numpy as np
from etils import epath

from realm_jax import default_files, extras, repeats
from realm_jax.data import corpus, corpus_changes, example_arrays, world
from realm_jax.evaluation import bootstrap, masked_lm
from realm_jax.experiments import preset as preset_lib
from realm_jax.experiments import runner
from realm_jax.experiments.presets._world import CORPUS, STALE_FACTOR
from realm_jax.training import curves, run_loader

SETUP = 'gin/setups/world.gin'
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


def make_world(spec: world.WorldSpec) -> dict:
  """The world's corpus and query arrays, at the shapes the setup's runs
  read, and its ICT pairs from the ordinary seqio task (`input.tasks.ict`)."""
  run_loader.configure(['gin/runs/pretrain.gin', SETUP], [])
  run = run_loader.configured_run().run
  metadata = world.write(world.World(spec), run.corpus_name,
                         run.shapes['query_token_ids'][0],
                         run.shapes['mlm_targets'][0])
  run_loader.configure(['gin/runs/ict.gin', SETUP], [])
  ict_run = run_loader.configured_run().run
  extras.require('seqio', "Writing the world's Inverse Cloze Task pairs",
                 'write the world where TensorFlow is and bring its corpus '
                 'and arrays')
  from realm_jax.input.tasks import ict  # pylint: disable=g-import-not-at-top
  ict.register(ict_run.corpus_name)
  exporter = run_loader.configured_run().exporter()
  for split in ('train', 'validation'):
    exporter.export(ict_run.task, split, ict_run.shapes, spec.seed,
                    corpus_name=ict_run.corpus_name)
  return {'corpus_dir': corpus.corpus_dir(run.corpus_name),
          'blocks': metadata['num_blocks'],
          'mean_block_length': metadata['mean_length'],
          'corpus_fingerprint': metadata['corpus_fingerprint']}


def score(model_dir: str, eval_dir: str, name: str,
          task: str | None = None, along: int | None = None) -> dict:
  """The held-out scores of the run's last step; with `along`, also of its
  checkpoints at each multiple of it before (kept by `train.keep_every`),
  under 'along': step -> scores, each named `along_name(name, step)`."""
  metrics = masked_lm.evaluate(model_dir, eval_dir, name, task=task)
  rows = masked_lm.read_queries(eval_dir, name)
  retrieved = any(r['top1_block_id'] is not None for r in rows)
  out = {**metrics, 'recall@1': _mean(_hits(rows)) if retrieved else None,
         'p_null': _mean([r['p_null'] for r in rows
                          if r['p_null'] is not None])}
  if along:
    out['along'] = score_along(model_dir, eval_dir, name,
                               range(along, metrics['step'], along))
  return out


def along_name(name: str, step: int) -> str:
  return f'{name}_step_{step}'


def score_along(model_dir: str, eval_dir: str, name: str, steps) -> dict:
  """The held-out accuracy and recall@1 of the run's checkpoints at `steps`,
  each with the corpus embedded by its own towers, as the last step's
  scores are: what the run had learned by then, not what the index it read
  then could find."""
  out = {}
  for step in steps:
    metrics = masked_lm.evaluate(model_dir, eval_dir, along_name(name, step),
                                 step=step)
    rows = masked_lm.read_queries(eval_dir, along_name(name, step))
    out[str(step)] = {
        'masked_token_accuracy': metrics['masked_token_accuracy'],
        'recall@1': _mean(_hits(rows)), 'index_step': metrics['index_step']}
  return out


def held_out_curve(model_dir: str) -> dict:
  """The trainer's held-out evaluations: step -> recall@1 (with the index
  the trainer was reading) and fill accuracy."""
  metrics = curves.read_metrics(os.path.join(model_dir,
                                             'train_metrics.jsonl'))
  out = {}
  for name, key in (('recall@1', 'eval/source_block_top1'),
                    ('accuracy', 'eval/masked_token_accuracy')):
    steps, values = metrics.get(key, ([], []))
    out[name] = dict(zip(steps, values))
  return out


def _hits(rows: list[dict]) -> list[float]:
  """Whether each query's first retrieved block is its person's document."""
  return [float(r['top1_block_id'] is not None
                and r['top1_block_id'] == r['block_id']) for r in rows]


def _mean(values) -> float | None:
  return float(np.mean(values)) if len(values) else None


def edit_check(spec: world.WorldSpec, model_dir: str, eval_dir: str
               ) -> dict:
  """Each edited person's document replaced (`corpus remove`, then `corpus
  add`, on a copy of the corpus swapped in whole, so that a killed stage
  can be run again), the index synced by embedding the new blocks alone;
  then their edited facts asked with the new values and with the old ones
  as targets. No training step runs."""
  from realm_jax.index import corpus_sync  # pylint: disable=g-import-not-at-top
  from realm_jax.training import step_inputs  # pylint: disable=g-import-not-at-top
  the_world = world.World(spec)
  edits = the_world.edits()
  people = {p.name: p for p in the_world.people}
  directory = corpus.corpus_dir(CORPUS)
  loaded = run_loader.load_run(model_dir)
  tokenizer = step_inputs.task_tokenizer()
  corpus_changes.recover(directory)
  # The world is built unchanged: a change there is this stage's, swapped
  # in before a kill.
  lineage = corpus.load_metadata(directory).get(corpus_changes.LINEAGE)
  if lineage:
    removed, added = lineage[-2]['block_ids'], range(*lineage[-1]['block_ids'])
  else:
    with tempfile.TemporaryDirectory() as tmp, \
        corpus_changes.transaction(directory) as staged:
      titles, articles = (os.path.join(tmp, n) for n in ('titles.txt',
                                                         'edited.jsonl'))
      epath.Path(titles).write_text(''.join(f'{n}\n' for n in edits))
      edited = [the_world.document(people[n], {**people[n].facts, **facts})
                for n, facts in edits.items()]
      world.check_covered(tokenizer,
                          (f'{d["title"]} {d["text"]}' for d in edited))
      epath.Path(articles).write_text(''.join(json.dumps(d) + '\n'
                                              for d in edited))
      _, removed = corpus_changes.remove_titles(staged, titles)
      _, added = corpus_changes.add_articles(staged, tokenizer, [articles])
  # None: synced before a kill.
  synced = (corpus_sync.sync_index(model_dir, directory,
                                   loaded.run.retriever())
            or corpus_sync.newest_metadata(model_dir))
  block_ids = dict(zip(edits, added))
  old = {n: {a: people[n].facts[a] for a in facts}
         for n, facts in edits.items()}
  shapes = loaded.run.shapes
  for task, facts in ((world.edited_task(CORPUS), edits),
                      (world.edited_task(CORPUS) + '_old', old)):
    world.write_queries(the_world, CORPUS, tokenizer, block_ids,
                        shapes['query_token_ids'][0],
                        shapes['mlm_targets'][0], edits=facts, task=task)
  new_value = score(model_dir, eval_dir, 'edited_new',
                    world.edited_task(CORPUS))
  old_value = score(model_dir, eval_dir, 'edited_old',
                    world.edited_task(CORPUS) + '_old')
  return {'people_edited': len(edits), 'blocks_removed': len(removed),
          'blocks_added': len(added),
          'index_sync_seconds': synced['synced_from']['seconds'],
          'answered_new_value': new_value['masked_token_accuracy'],
          'answered_old_value': old_value['masked_token_accuracy'],
          'recall@1_new_document': new_value['recall@1'],
          'model_step': new_value['step']}


def world_spec(spec: preset_lib.Preset) -> world.WorldSpec:
  """The world a preset writes (its 'world' stage's)."""
  return world.WorldSpec(**spec.stage('world').args['spec'])


def realm(ctx: runner.Context, run_dir: str, bindings: dict,
          builder: dict | None) -> dict:
  """A REALM run (or a control) from the two warm starts, the index builder
  beside it where it has one: re-embedding as soon as it can (the paper's
  asynchronous refresh), or, with the `lockstep` option, on `IndexClient`'s
  fixed schedule, so that what the trainer retrieves from does not depend
  on how fast the builder is (see `LOCKSTEP_WHY`)."""
  if builder is not None and ctx.options.get('lockstep'):
    bindings = {**bindings, 'IndexClient.lockstep_interval': (
        builder['run_refresh.refresh_interval_steps']
        * builder['run_refresh.stale_factor'])}
  return runner.train(
      ctx, 'pretrain', bindings, run_dir, builder, poll_seconds=0.5,
      refresh_timeout=300,
      corpus_dir=corpus.corpus_dir(CORPUS) if builder else None)


# The world's stages besides 'machine' and 'train' (`presets/_world.py`
# makes them).
KINDS = {
    'world': lambda ctx, spec: make_world(world.WorldSpec(**spec)),
    'realm': realm,
    'score': lambda ctx, run_dir, name=None, task=None, along=None: score(
        ctx.dir(run_dir), ctx.dir('eval'), name or run_dir, task, along),
    'edit': lambda ctx, run_dir: edit_check(
        world_spec(ctx.preset), ctx.dir(run_dir), ctx.dir('eval')),
}


def begin(spec: preset_lib.Preset, work_dir: str, options: dict) -> dict:
  """The world's corpus, arrays and vocabulary (`world.VOCAB_SIZE`) live in
  the work_dir, not beside the demo's (the index builder's process
  inherits these)."""
  os.environ[corpus.CORPUS_ROOT_ENV] = os.path.join(work_dir, 'corpora')
  os.environ[example_arrays.ROOT_ENV] = os.path.join(work_dir, 'arrays')
  os.environ[default_files.VOCAB_ENV] = world.write_vocabulary(
      os.path.join(work_dir, 'vocab.txt'))
  return {'spec': dataclasses.asdict(world_spec(spec)),
          'refresh': 'lockstep' if options.get('lockstep') else 'async'}


def finish(spec: preset_lib.Preset, work_dir: str, results: dict,
           qa_ran: bool) -> dict:
  """Each run's held-out curve, and the comparisons of their scores."""
  del qa_ran
  names = [s.args['run_dir'] for s in spec.stages if s.kind == 'realm']
  # The steps both REALM and the stale run were scored at.
  held = results.get('held_out', {})
  along = sorted(set.intersection(*(
      {int(s) for s in held.get(n, {}).get('along', {})}
      for n in ('realm', 'stale'))))
  return {'curves': {name: held_out_curve(os.path.join(work_dir, name))
                     for name in names},
          'comparisons': comparisons(world_spec(spec),
                                     os.path.join(work_dir, 'eval'), names,
                                     along)}


def run(work_dir: str = 'runs/world', preset: str = 'world',
        docs_dir: str | None = None, seed: int = 0,
        lockstep: bool = False) -> dict:
  """Every stage of `preset` in order, each run's parameters, dropout and
  data order from `seed` (the world itself is the preset's); returns (and
  writes) the results."""
  return runner.run(FAMILY, work_dir, preset, docs_dir, seed,
                    lockstep=lockstep)


def prior_rows(spec: world.WorldSpec, rows: list[dict]) -> list[dict]:
  """The value prior's answers to the held-out queries, in the arrays'
  order (which `evaluate` keeps): right where the fact is the attribute's
  most frequent training value."""
  the_world = world.World(spec)
  queries, prior = the_world.queries('held_out'), the_world.prior()
  if len(queries) != len(rows):
    raise ValueError(f'{len(rows)} scored rows for {len(queries)} held-out '
                     'queries.')
  return [{'key': r['key'], 'masked_tokens': 1.0,
           'correct_tokens': float(q.value == prior[q.attribute]),
           'log_likelihood': 0.0} for q, r in zip(queries, rows)]


def comparisons(spec: world.WorldSpec, eval_dir: str, names: list[str],
                along: list[int] = ()) -> dict:
  """REALM against each control on the held-out queries; `along`: the
  steps before the last at which REALM and the stale run were also scored
  (`score_along`)."""
  rows = {name: masked_lm.read_queries(eval_dir, name) for name in names}
  rows['prior'] = prior_rows(spec, rows['realm'])
  out = {f'realm_vs_{b}': masked_lm.compare(rows['realm'], rows[b])
         for b in ('baseline', 'prior', 'stale', 'frozen', 'start')
         if b in rows}
  out['baseline_vs_prior'] = masked_lm.compare(rows['baseline'],
                                               rows['prior'])
  for b in ('stale', 'frozen', 'start'):
    if b in rows:
      ones = np.ones(len(rows['realm']))
      out[f'realm_vs_{b}']['recall@1'] = bootstrap.paired_interval(
          np.array(_hits(rows['realm'])), np.array(_hits(rows[b])), ones,
          scale=100)
  if 'stale' in rows and along:
    out['realm_vs_stale_along'] = compare_along(
        *(averaged([masked_lm.read_queries(eval_dir, along_name(n, step))
                    for step in along] + [rows[n]])
          for n in ('realm', 'stale')))
  # Rows follow `World.queries`: each fact in every template in turn.
  templates = len(next(iter(world.QUERY_TEMPLATES.values())))
  out['recall@1_by_template'] = {
      name: [_mean(_hits(rows[name])[t::templates]) for t in range(templates)]
      for name in names if name != 'baseline'}
  no_doc = masked_lm.read_queries(eval_dir, 'no_document')
  out['p_null'] = {
      'no_document': _mean([r['p_null'] for r in no_doc]),
      'with_document': _mean([r['p_null'] for r in rows['realm']]),
      'interval': _unpaired([r['p_null'] for r in no_doc],
                            [r['p_null'] for r in rows['realm']])}
  return out


def averaged(scorings: list[list[dict]]) -> list[dict]:
  """Each query's rows of several scorings of one run (one per step), as
  one row: its correct tokens, log-likelihood and first-block hit averaged
  over them."""
  keys = [r['key'] for r in scorings[0]]
  if any([r['key'] for r in rows] != keys for rows in scorings):
    raise ValueError('The scorings along the run scored different queries.')
  mean = lambda field, i: float(np.mean([rows[i][field]
                                         for rows in scorings]))
  return [{'key': key, 'masked_tokens': scorings[0][i]['masked_tokens'],
           'correct_tokens': mean('correct_tokens', i),
           'log_likelihood': mean('log_likelihood', i),
           'hit': float(np.mean([_hits([rows[i]])[0] for rows in scorings]))}
          for i, key in enumerate(keys)]


def compare_along(rows_a: list[dict], rows_b: list[dict]) -> dict:
  """A - B of two runs' `averaged` rows, each with its paired interval."""
  out = masked_lm.compare(rows_a, rows_b)
  out['recall@1'] = bootstrap.paired_interval(
      np.array([r['hit'] for r in rows_a]),
      np.array([r['hit'] for r in rows_b]), np.ones(len(rows_a)), scale=100)
  return out


def _unpaired(a, b, samples: int = bootstrap.SAMPLES) -> dict:
  """mean(a) - mean(b) of two independent samples, a 95% bootstrap
  interval resampling each."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  rng = np.random.default_rng(0)
  draws = (a[rng.integers(len(a), size=(samples, len(a)))].mean(1)
           - b[rng.integers(len(b), size=(samples, len(b)))].mean(1))
  low, high = np.percentile(draws, [2.5, 97.5])
  return {'a': a.mean(), 'b': b.mean(), 'difference': a.mean() - b.mean(),
          'low': float(low), 'high': float(high),
          'excludes_zero': bool(low > 0 or high < 0)}


# The comparisons' paths in `comparisons` -> (label, digits), as reported.
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
  """Each run scored along its training (`score_along`): step -> its
  held-out scores, the last step's included."""
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
      f'{results.get("seed", 0)}. The baseline (the null document alone) and the frozen retriever '
      'train for the same steps from the same warm starts; the start is the '
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
  the trainer evaluated them (`held_out_curve`)."""
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
  report (`run_repeats`')."""
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


def run_repeats(work_dir: str, preset: str, docs_dir: str | None,
                runs: int, lockstep: bool = False) -> dict:
  """The preset `runs` times, seeds 0 to runs - 1, each in
  work_dir/seed_<s> (see `repeats`); the report puts each figure's mean
  and range and each comparison's every interval first, then seed 0's
  whole report."""
  results = [run(repeats.run_dir(work_dir, seed), preset, None, seed,
                 lockstep) for seed in range(runs)]
  summary = repeats.spread(results, figures)
  first = results[0]
  interval = preset_lib.load(preset).sizes['refresh_interval']
  m = first['machine']
  text = '\n'.join([
      f'# realm-jax `{preset}` over {runs} runs: REALM in a controlled '
      'knowledge world', '',
      f'Machine: {m["cpu"]}, {m["cores"]} cores, 2048^3 float32 matmul '
      f'{m["matmul_2048_gflops"]} GFLOP/s in JAX (the first run). Commit: '
      f'{m.get("commit") or "not recorded"}. Seeds '
      f'{", ".join(map(str, summary["seeds"]))}: each run\'s parameters, '
      'dropout and data order; the world is the same. Index refresh: '
      f'{REFRESH_MODES[first["refresh"]]}.', '', LOCKSTEP_WHY.format(
          i=interval, f=STALE_FACTOR, stale=2 * interval * STALE_FACTOR), '',
      '## Figures: the mean over runs, the range, every run', '',
      *repeats.figure_rows(summary), '',
      '## Goals, on the mean (comparisons: every run\'s interval above 0)',
      '', *goal_rows({k: d['mean'] for k, d in summary['figures'].items()},
                     summary['comparisons']), '',
      '## Comparisons: each run\'s paired 95% interval, their mean and '
      'range', '', *repeats.comparison_rows(summary, COMPARISONS), '',
      '---', '', markdown(first).replace('# realm-jax `world`:',
                                          '# Seed 0 in full:', 1)])
  record = {'preset': preset, 'repeats': summary, 'runs': results}
  report(first, work_dir, docs_dir, text, record)
  return record


FAMILY = runner.Family('world', KINDS, lambda spec: False, begin, finish,
                       report)
