"""`realm-jax demo --preset=world`: REALM's claims in a controlled world: the
stage kinds (the world's data generator, REALM with its builder, the
scores, the edit check) and comparisons of the world's presets, whose
stages `presets/_world.py` lists, which `runner` runs and whose report
`world_report` writes.

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
  documents (the paper's retriever start; see `world_report.ICT_WHY`);
- reader: the reader's warm start, reading each training query's own
  document (see `world_report.READER_WHY`); the retriever is untouched by it;
- pretrain_realm, pretrain_stale (index builder beside the trainer),
  pretrain_frozen (towers frozen) and pretrain_baseline (null document
  alone), all from the same two warm starts for the same steps, and
  pretrain_start, the same run for no step;
- scoring of the held-out queries, the people without a document, and
  the edit check.
The report (`world_report`) is work_dir/RESULTS.md with results.json and
world.png; with `realm-jax demo --record`, docs/results/world.{md,json,png}
too.
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
from realm_jax.experiments import runner, world_report
from realm_jax.experiments.presets._world import CORPUS, STALE_FACTOR
from realm_jax.training import curves, run_loader

SETUP = 'gin/setups/world.gin'


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
  on how fast the builder is (see `world_report.LOCKSTEP_WHY`)."""
  if builder is not None and ctx.options.get('lockstep'):
    bindings = {**bindings, 'IndexClient.lockstep_interval': (
        builder['run_refresh.refresh_interval_steps']
        * builder['run_refresh.stale_factor'])}
  return runner.train(
      ctx, 'pretrain', bindings, run_dir, builder, poll_seconds=0.5,
      refresh_timeout=300)


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


def run_repeats(work_dir: str, preset: str, docs_dir: str | None,
                runs: int, lockstep: bool = False) -> dict:
  """The preset `runs` times, seeds 0 to runs - 1, each in
  work_dir/seed_<s> (see `repeats`); the report puts each figure's mean
  and range and each comparison's every interval first, then seed 0's
  whole report."""
  results = [run(repeats.run_dir(work_dir, seed), preset, None, seed,
                 lockstep) for seed in range(runs)]
  summary = repeats.spread(results, world_report.figures)
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
      f'{world_report.REFRESH_MODES[first["refresh"]]}.', '',
      world_report.LOCKSTEP_WHY.format(
          i=interval, f=STALE_FACTOR, stale=2 * interval * STALE_FACTOR), '',
      '## Figures: the mean over runs, the range, every run', '',
      *repeats.figure_rows(summary), '',
      '## Goals, on the mean (comparisons: every run\'s interval above 0)',
      '', *world_report.goal_rows(
          {k: d['mean'] for k, d in summary['figures'].items()},
          summary['comparisons']), '',
      '## Comparisons: each run\'s paired 95% interval, their mean and '
      'range', '',
      *repeats.comparison_rows(summary, world_report.COMPARISONS), '',
      '---', '', world_report.markdown(first).replace(
          '# realm-jax `world`:', '# Seed 0 in full:', 1)])
  record = {'preset': preset, 'repeats': summary, 'runs': results}
  world_report.report(first, work_dir, docs_dir, text, record)
  return record


FAMILY = runner.Family('world', KINDS, lambda spec: False, begin, finish,
                       world_report.report)
