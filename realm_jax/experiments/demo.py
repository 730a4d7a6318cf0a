"""`make demo` and `make reproduce`: REALM in miniature, stage by stage: the
stage kinds and comparisons of the Wikipedia-leads presets, whose stages
are their files' (`presets/demo.py`, ...), which `runner` runs and whose
report `demo_report` writes.

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
(`demo_report.report`) writes results.json, RESULTS.md and the pre-training
curves into work_dir, and with `--record` into docs/results as well (the
record runs are compared against, which no other run overwrites).
"""

import logging
import os
import statistics

from etils import epath

from realm_jax import default_files, errors, repeats
from realm_jax.data import corpus, example_arrays, open_qa
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.evaluation import masked_lm, qa_evaluation
from realm_jax.experiments import demo_report
from realm_jax.experiments import preset as preset_lib
from realm_jax.experiments import runner
from realm_jax.experiments.presets._wiki import QA_TASKS
from realm_jax.models import flops
from realm_jax.training import curves, run_loader

log = logging.getLogger(__name__)

# The questions a lever is chosen on: NQ's dev topics (8,757, ORQA's dev
# split of NQ's train) and WebQuestions' train questions (3,778). NQ's test
# questions report what was chosen and never choose.
SELECTION = (qa_evaluation.QASplit('nq_open', 'train'),
             qa_evaluation.QASplit('web_questions', 'train'))


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


def run_repeats(work_dir: str, preset: str, docs_dir: str | None,
                runs: int) -> dict:
  """The preset `runs` times, seeds 0 to runs - 1, each in
  work_dir/seed_<s> (`repeats`). The report gives each figure's mean and
  range and each comparison's every interval, then seed 0's own report;
  the record is seed 0's results (what `stage_plan` reads) with the
  spread ('repeats') and every run ('runs')."""
  results = [run(repeats.run_dir(work_dir, seed), preset, None, seed)
             for seed in range(runs)]
  summary = repeats.spread(results, demo_report.figures)
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
      '', *repeats.comparison_rows(summary, demo_report.COMPARISONS), '',
      '---', '',
      demo_report.markdown(first, demo_report.saved_configs(first_dir)).replace(
          f'# realm-jax `{preset}` results', '# Seed 0 in full', 1)])
  record = {**first, 'repeats': summary, 'runs': results}
  demo_report.report(first, work_dir, docs_dir, text, record, first_dir)
  return record


FAMILY = runner.Family('demo', KINDS, has_qa, lambda *_: {}, finish,
                       demo_report.report)
