"""`realm-jax eval`: Open-QA scored as REALM scores it.

The run's source of examples (`realm_jax.input`) gives a benchmark task's
test questions (read through its seqio task, or from its exported arrays);
a `QAPredictor` answers them and the task's own metric scores them: exact
match, or regex match for CuratedTREC (`data.metrics`, the functions the
seqio tasks declare). A file of questions (`QAFile`) is read and tokenized
here, as its seqio task would give it, and scored by that task's metric: no
TensorFlow to start and no per-question trip through tf.data, which took
longer than the scoring.
Beside it this module measures retrieval as DPR and every later paper print it:
top-k accuracy at k = 1, 5, 20 and 100 (REALM's recall@5 is top-5), the
fraction of questions with an answer in one of their top k blocks by DPR's
`has_answer`, and which questions have an answer anywhere in the corpus
(the subset the small embedded corpus can answer at all). Every prediction
is written as a JSONL row with its retrieved blocks; the retrievals can
also be written as the files DPR's, Pyserini's and trec_eval's scorers read.
"""

import dataclasses
import functools
import hashlib
import json
import logging

import numpy as np
from etils import epath

from realm_jax.data import answer_matching, corpus, metrics, open_qa
from realm_jax.evaluation import bootstrap
from realm_jax.evaluation.prediction import QAPredictor
from realm_jax.progress import Progress
from realm_jax.training.step_inputs import token_arrays

# The k of top-k accuracy, DPR's and Pyserini's (k past what a run
# retrieves left out).
TOP_K = (1, 5, 20, 100)
# The layouts of `retrieval_file`.
RETRIEVAL_FORMATS = ('dpr', 'pyserini', 'trec')
# The largest corpus whose every block is searched for every question's
# answer; past it the answer-in-corpus figures are skipped. One pass reads
# thousands of blocks a second for strings on one CPU core:
# 2M blocks is minutes, Wikipedia's 13M would be the better part of an hour
# for each new question file, and a file of patterns many times that.
ANSWER_SCAN_BLOCKS = 2_000_000

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class QAFile:
  """An Open-QA file, every question scored (`open_qa.load_file`), named
  as its seqio task is (`open_qa.qa_file_task_name`). `regex`: its answers
  are patterns, scored by regex match."""
  path: str
  regex: bool = False

  @property
  def task(self) -> str:
    return open_qa.qa_file_task_name(self.path, self.regex)

  def rows(self) -> list:
    return open_qa.load_file(self.path, self.regex)


@dataclasses.dataclass(frozen=True)
class QASplit:
  """A split of an Open-QA benchmark read from its data directory
  (`open_qa.load`), every question scored. Its train splits are where a
  lever is chosen (NQ's dev topics, WebQuestions' train), so that the test
  split reports what was chosen and never chooses."""
  benchmark: str
  split: str

  @property
  def task(self) -> str:
    return f'{self.benchmark}_{self.split}'

  @property
  def regex(self) -> bool:
    return self.benchmark in open_qa.REGEX_ANSWERS

  def rows(self) -> list:
    return open_qa.load(self.benchmark, self.split)


def _predict(predictor: QAPredictor, task: str, batches, total: int,
             batch_size: int, results: dict) -> list[tuple[int, str]]:
  """(index, predicted answer) of each question of `batches` ((indices,
  query_token_ids) pairs), its whole result kept in `results`."""
  progress = Progress(f'eval {task}', total, unit='questions', every_s=15)
  outputs = []
  for indices, ids in batches:
    # One shape for every batch: the last one would compile anew.
    padded = np.pad(ids, ((0, batch_size - len(ids)), (0, 0)))
    batch = predictor.predict(token_arrays(padded))[:len(ids)]
    for index, result in zip(indices, batch):
      results[int(index)] = result
      answers = result.get('answers') or []
      outputs.append((int(index), answers[0].text if answers else ''))
    progress.update(len(indices))
  return outputs


def _task_evaluation(predictor, task, batch_size, num_examples, results):
  """(examples, regex, task metrics) of a benchmark task's test questions,
  as the run's source gives them."""
  questions = predictor.source.questions(task, predictor.query_length,
                                         num_examples)
  return _scored(predictor, task, questions.examples,
                 questions.query_token_ids, questions.regex, batch_size,
                 results)


def _file_evaluation(predictor, qa_file: 'QAFile | QASplit', batch_size,
                     num_examples, results):
  """(examples, regex, task metrics) of every question of a file or split,
  read and tokenized without seqio, scored as its seqio task scores
  them."""
  rows = qa_file.rows()[:num_examples]
  examples = [{'question': q, 'answers': list(a)} for q, a in rows]
  ids = open_qa.query_token_ids(predictor.tokenizer, [q for q, _ in rows],
                                predictor.query_length)
  return _scored(predictor, qa_file.task, examples, ids, qa_file.regex,
                 batch_size, results)


def _scored(predictor, task, examples, ids, regex, batch_size, results):
  """`_predict` over the questions `ids` (their rows 0 to len(examples)),
  then (examples, regex, the task's metric)."""
  count = len(examples)
  outputs = _predict(predictor, task, (
      (np.arange(start, min(start + batch_size, count)),
       np.asarray(ids[start:min(start + batch_size, count)]))
      for start in range(0, count, batch_size)), count, batch_size, results)
  if not predictor.reads:
    return examples, regex, {}
  score = metrics.regex_match if regex else metrics.exact_match
  return examples, regex, score([e['answers'] for e in examples],
                                [text for _, text in sorted(outputs)])


def answers_in_corpus(corpus_dir: str, corpus_answers, num_blocks: int,
                      questions: list[tuple[list[str], bool]],
                      max_blocks: int = ANSWER_SCAN_BLOCKS
                      ) -> list[bool] | None:
  """Which questions have an answer in some block of the corpus (DPR's
  `has_answer`), or None for a corpus past `max_blocks`.

  Found once for a corpus and a list of questions, and kept beside the
  corpus in a file named by both fingerprints; a corpus changed by `corpus
  add` or `remove` has a new fingerprint, so nothing stale is read.
  """
  fingerprint = corpus.load_metadata(corpus_dir)['corpus_fingerprint']
  questions_digest = hashlib.sha256(json.dumps(questions).encode())
  path = (epath.Path(corpus_dir) / f'answers_in_corpus-{fingerprint[:16]}-'
          f'{questions_digest.hexdigest()[:16]}.json')
  if path.exists():
    return json.loads(path.read_text())
  if num_blocks > max_blocks:
    log.warning('answer in corpus: skipped, %s has %d blocks (more than '
                '%d to search); the *_answer_in_corpus figures are left out.',
                corpus_dir, num_blocks, max_blocks)
    return None
  progress = Progress('answers in corpus', num_blocks, unit='blocks',
                      every_s=15)
  found = corpus_answers.anywhere(questions, lambda: progress.update(1))
  staged = path.parent / f'{path.name}.tmp'
  try:  # Whole or not at all; a read-only corpus is searched each time.
    staged.write_text(json.dumps(found))
    staged.replace(path)
  except OSError as error:
    log.warning('answer in corpus: not kept beside the corpus (%s).', error)
  return found


def evaluate(predictor: QAPredictor, task: 'str | QAFile | QASplit',
             output_dir: str, batch_size: int = 32,
             num_examples: int | None = None,
             retrieval_output: str | None = None,
             retrieval_format: str = 'dpr') -> dict:
  """Scores `predictor` on `task`: a benchmark's test split, a file's
  questions or a benchmark's split (`QAFile`, `QASplit`).

  Writes output_dir/<task>_predictions.jsonl and <task>_metrics.json and
  returns the metrics: exact_match (or regex_match) when the predictor reads,
  top-k accuracy for each k of `TOP_K` the predictor retrieves, and both
  again on the questions whose answer is in the corpus. With
  `retrieval_output`, also writes the retrievals there in
  `retrieval_format` (one of `RETRIEVAL_FORMATS`, see `retrieval_file`). The
  test questions come from the run's source (the seqio task or its
  exported arrays), the others from their files, scored by the same
  metric.
  """
  results: dict[int, dict] = {}
  read_here = isinstance(task, (QAFile, QASplit))
  evaluation = _file_evaluation if read_here else _task_evaluation
  examples, regex, task_metrics = evaluation(predictor, task, batch_size,
                                             num_examples, results)
  if read_here:
    task = task.task

  texts = predictor.texts
  ks = [k for k in TOP_K if k <= predictor.top_k]
  corpus_answers = answer_matching.CorpusAnswers(texts.bodies)
  references_of = [[_text(a) for a in e['answers']] for e in examples]
  in_corpus = answers_in_corpus(predictor.retrieval.corpus_dir,
                                corpus_answers, len(texts.bodies),
                                [(r, regex) for r in references_of])
  # A block's title decoded once, not once for each question retrieving it.
  title = functools.cache(lambda block_id: texts.titles.get(block_id, ''))
  rows = []
  for index, (example, references) in enumerate(zip(examples,
                                                    references_of)):
    result = results[index]
    retrieved = [(i, s) for i, s in zip(result['block_ids'],
                                        result['retrieval_scores']) if i >= 0]
    hits = corpus_answers.holds([i for i, _ in retrieved], references, regex)
    rank = hits.index(True) + 1 if any(hits) else None
    answers = result.get('answers') or []
    prediction = answers[0].text if answers else ''
    row = {
        'question': _text(example['question']),
        'references': references,
        'answer_rank': rank,
        'answer_in_top': {str(k): rank is not None and rank <= k
                          for k in ks},
        'answer_in_corpus': in_corpus and in_corpus[index],
        'retrieved': [{'block_id': i, 'title': title(i),
                       'score': s, 'has_answer': hit}
                      for (i, s), hit in zip(retrieved, hits)],
    }
    if predictor.reads:
      row.update(
          prediction=prediction,
          p_answer=answers[0].probability if answers else 0.0,
          correct=(answer_matching.regex_match_score(prediction, references)
                   if regex else
                   answer_matching.exact_match_score(prediction, references)),
          candidates=result['candidates'])
    rows.append(row)

  percent = lambda xs: 100.0 * float(np.mean(xs)) if len(xs) else 0.0
  subset = [r for r in rows if r['answer_in_corpus']]
  summary = {
      'task': task, 'model_dir': predictor.model_dir,
      'run_kind': predictor.kind, 'step': predictor.step,
      'index_step': predictor.retrieval.client.index_step,
      'questions': len(rows),
      'answer_in_corpus': len(subset) if in_corpus is not None else None,
      'retrieved': predictor.top_k,
  }
  for k in ks:
    summary[f'top-{k}'] = percent([r['answer_in_top'][str(k)] for r in rows])
    if in_corpus is not None:
      summary[f'top-{k}_answer_in_corpus'] = percent(
          [r['answer_in_top'][str(k)] for r in subset])
  summary.update({name: float(v) for name, v in task_metrics.items()})
  if predictor.reads:
    name = 'regex_match' if regex else 'exact_match'
    own = percent([r['correct'] for r in rows])
    if abs(own - summary[name]) > 1e-6:
      raise AssertionError(f'{name}: the task metric says {summary[name]}, the '
                           f'predictions file says {own}.')
    if in_corpus is not None:
      summary[f'{name}_answer_in_corpus'] = percent(
          [r['correct'] for r in subset])
    summary['unaligned_spans'] = texts.unaligned
  output = epath.Path(output_dir)
  output.mkdir(parents=True, exist_ok=True)
  (output / f'{task}_predictions.jsonl').write_text(
      ''.join(json.dumps(row) + '\n' for row in rows))
  (output / f'{task}_metrics.json').write_text(json.dumps(summary, indent=2))
  if retrieval_output:
    epath.Path(retrieval_output).write_text(retrieval_file(
        rows, texts, retrieval_format,
        tag=f'realm-jax_{predictor.kind}_{predictor.step}'))
  return summary


def retrieval_file(rows: list[dict], texts, kind: str = 'dpr',
                   tag: str = 'realm-jax') -> str:
  """The text of a file of the retrievals of `evaluate`'s rows.

  kind 'dpr': as DPR's retriever writes them, a JSON list of {question,
  answers, ctxs: [{id, title, text, score, has_answer}]}, read by DPR's
  evaluation. 'pyserini': as Pyserini's `evaluate_dpr_retrieval` reads
  them, {question number: {question, answers, contexts: [{docid, score,
  text: title and body on two lines, has_answer}]}}. 'trec': a TREC run,
  `qid Q0 docid rank score tag` a line, which trec_eval and Pyserini's
  evaluation read against qrels (qid the question's number, as Pyserini
  numbers DPR's topics; rank from 1). Scores are written as DPR writes
  them, in full: trec_eval orders a run by score, not by rank.
  """
  if kind == 'dpr':
    return json.dumps([
        {'question': r['question'], 'answers': r['references'],
         'ctxs': [{'id': str(c['block_id']), 'title': c['title'],
                   'text': texts.bodies[c['block_id']],
                   'score': str(c['score']), 'has_answer': c['has_answer']}
                  for c in r['retrieved']]} for r in rows], indent=1)
  if kind == 'pyserini':
    return json.dumps({
        str(n): {'question': r['question'], 'answers': r['references'],
                 'contexts': [{'docid': str(c['block_id']),
                               'score': str(c['score']),
                               'text': f'{c["title"]}\n'
                                       f'{texts.bodies[c["block_id"]]}',
                               'has_answer': c['has_answer']}
                              for c in r['retrieved']]}
        for n, r in enumerate(rows)}, indent=1)
  if kind == 'trec':
    return ''.join(f'{n} Q0 {c["block_id"]} {rank} {c["score"]} {tag}\n'
                   for n, r in enumerate(rows)
                   for rank, c in enumerate(r['retrieved'], 1))
  raise ValueError(f'retrieval_format {kind!r}: one of '
                   + ', '.join(map(repr, RETRIEVAL_FORMATS)) + '.')


def _text(value) -> str:
  """A string feature: bytes from seqio, str from exported arrays."""
  return value.decode('utf-8') if isinstance(value, bytes) else value


def read_predictions(output_dir: str, task: str) -> list[dict]:
  path = epath.Path(output_dir) / f'{task}_predictions.jsonl'
  return [json.loads(line) for line in path.read_text().splitlines()]


def _value(row: dict, field: str) -> bool:
  if field.startswith('top-'):
    return row['answer_in_top'][field[len('top-'):]]
  return row[field]


def compare(rows_a: list[dict], rows_b: list[dict], field: str,
            answer_in_corpus_only: bool = False, **kwargs) -> dict:
  """A - B in points of a per-question field ('top-5' for top-5 accuracy,
  REALM's recall@5; 'correct' for EM) over the same questions, with its
  paired bootstrap interval; optionally only where the answer is in the
  corpus."""
  if [r['question'] for r in rows_a] != [r['question'] for r in rows_b]:
    raise ValueError('The two evaluations answered different questions.')
  if answer_in_corpus_only and any(r['answer_in_corpus'] is None
                                   for r in rows_a + rows_b):
    raise ValueError('The answer-in-corpus subset was not found for this '
                     f'corpus (past {ANSWER_SCAN_BLOCKS:,} blocks).')
  pairs = [(_value(a, field), _value(b, field)) for a, b in zip(rows_a, rows_b)
           if a['answer_in_corpus'] or not answer_in_corpus_only]
  a, b = (np.array(x, np.float64) for x in zip(*pairs))
  return bootstrap.paired_interval(a, b, scale=100, **kwargs)
