"""Held-out masked salient-span prediction of a pre-training run, per query.

The paper's pre-training claim at small scale: the same reader, with and
without retrieved documents. Every salient span of every held-out block is
masked once (the task `realm_pretrain_<corpus>_every_salient_span`), so every
model is scored on the same queries, and each query's terms are kept for a
paired bootstrap against another model (`compare`). Each row also
holds the terms of the same reader reading the null document alone
(`null_document`), the paper's no-retrieval ablation, from the same pass.
"""

import hashlib
import json
import os

import jax
import numpy as np
from etils import epath

from realm_jax.data import corpus, masked_queries, task_names
from realm_jax.evaluation import bootstrap
from realm_jax.evaluation.prediction import RestoredRun
from realm_jax.progress import Progress
from realm_jax.input.source import Source
from realm_jax.training import partitioning

TERMS = ('masked_tokens', 'correct_tokens', 'log_likelihood',
         'null_correct_tokens', 'null_log_likelihood')


def held_out_queries(source: Source, corpus_name: str, shapes: dict) -> int:
  """How many queries the held-out task gives: the held-out salient spans
  (counted in the annotated corpus, or read from the exported arrays)."""
  count = source.example_count(task_names.held_out(corpus_name),
                               'validation', shapes)
  if count is not None:
    return count
  tf = corpus.tensorflow()
  from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
  path = os.path.join(corpus.corpus_dir(corpus_name),
                      salient_spans.ANNOTATED_DIR, 'validation.tfrecord')
  return sum(int(tf.size(block['span_starts'])) for block in
             tf.data.TFRecordDataset(path).map(
                 salient_spans.parse_annotated_block))


def _query_key(examples, row) -> str:
  """What pairs two models' rows: the query and its targets."""
  data = (examples['query_token_ids'][row].tobytes()
          + examples['mlm_targets'][row].tobytes())
  return hashlib.sha1(data).hexdigest()[:16]


def evaluate(model_dir: str, output_dir: str, name: str = 'masked_lm',
             gin_files=(), gin_bindings=(), batch_size: int = 32,
             step: int | None = None, max_queries: int | None = None,
             task: str | None = None) -> dict:
  """Scores every held-out query (or those of `task`'s validation split)
  with the index of the evaluated step.

  Writes output_dir/<name>_queries.jsonl (one row per query: its key,
  TERMS, p(null|x), and its first retrieved block) and <name>_metrics.json,
  and returns the metrics: masked-token accuracy, -log p(y|x) and
  retrieval_utility per masked token.
  """
  restored = RestoredRun(model_dir, step, gin_files, gin_bindings,
                         reader='Pretrain')
  run = restored.run
  preparer = run.input_preparer(restored.model_dir, restored.mesh)
  preparer.retrieval.index_at(restored.step, restored.params['retriever'])
  preparer.keep_candidate_ids = True
  # The index of this step's towers holds the candidates' embeddings (the
  # exact searcher keeps them): the document tower is not run again.
  preparer.index_embeddings = bool(
      preparer.retrieval.fetch) and preparer.retrieval.client.keeps_embeddings
  per_example = jax.jit(run.objective.per_example)
  rows = []
  task = task or task_names.held_out(run.corpus_name)
  total = (restored.source.example_count(task, 'validation', run.shapes)
           or held_out_queries(restored.source, run.corpus_name, run.shapes))
  progress = Progress(f'masked LM {name}', min(total, max_queries or total),
                      unit='queries', every_s=15)
  first = int(preparer.null_document)  # The first retrieved block's column.
  for examples in restored.source.batches(
      task, 'validation', run.shapes, batch_size,
      shuffle=False, num_epochs=1, drop_remainder=False):
    count = len(examples['block_id'])
    # One shape for every batch: zero rows (no masked token) pad the last.
    padded = {k: np.concatenate([v, np.zeros(
        (batch_size - count, *v.shape[1:]), v.dtype)])
              for k, v in examples.items()}
    inputs, _ = preparer.prepare(padded, restored.params, restored.step)
    ids = inputs.pop('candidate_ids')
    terms = jax.device_get(per_example(
        restored.params, partitioning.global_batch(inputs, restored.mesh)))
    retrieved = masked_queries.spans_held(
        inputs['candidates']['token_ids'], inputs['mlm_targets'],
        inputs['mlm_mask']).any(axis=1)
    for row in range(count):
      rows.append({'key': _query_key(examples, row),
                   'block_id': int(examples['block_id'][row]),
                   'span_retrieved': bool(retrieved[row]),
                   'top1_block_id': (int(ids[row, first])
                                     if ids.shape[1] > first else None),
                   'p_null': (float(terms['p_z'][row, 0])
                              if preparer.null_document else None),
                   **{t: float(terms[t][row]) for t in TERMS}})
    progress.update(count)
    if max_queries and len(rows) >= max_queries:
      rows = rows[:max_queries]
      break
  summary = {'model_dir': model_dir, 'step': restored.step,
             'index_step': preparer.retrieval.client.index_step,
             'num_candidates': run.objective.num_candidates,
             # How many distinct queries the run could draw (its report
             # says how many it saw, and how often one came back).
             'train_queries_an_epoch': restored.source.example_count(
                 run.task, 'train', run.shapes),
             **summarize(rows)}
  output = epath.Path(output_dir)
  output.mkdir(parents=True, exist_ok=True)
  (output / f'{name}_queries.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in rows))
  (output / f'{name}_metrics.json').write_text(json.dumps(summary, indent=2))
  return summary


def summarize(rows: list[dict]) -> dict:
  """Per-masked-token metrics of the scored queries."""
  total = {t: sum(r.get(t, 0) for r in rows) for t in TERMS}
  tokens = max(total['masked_tokens'], 1)
  summary = {
      'queries': len(rows), 'masked_tokens': int(total['masked_tokens']),
      'masked_token_accuracy': total['correct_tokens'] / tokens,
      'null_document_accuracy': total['null_correct_tokens'] / tokens,
      'loss': -total['log_likelihood'] / tokens,
      'retrieval_utility': (total['log_likelihood']
                            - total['null_log_likelihood']) / tokens,
      'span_retrieved': sum(r.get('span_retrieved', False) for r in rows)
                        / max(len(rows), 1)}
  hits = [r for r in rows if r.get('span_retrieved')]
  if hits and len(hits) < len(rows):  # Where the reader could copy.
    summary['span_retrieved_queries'] = {
        k: v for k, v in summarize(hits).items()
        if k in ('queries', 'masked_token_accuracy', 'loss',
                 'retrieval_utility')}
  return summary


def read_queries(output_dir: str, name: str) -> list[dict]:
  path = epath.Path(output_dir) / f'{name}_queries.jsonl'
  return [json.loads(line) for line in path.read_text().splitlines()]


def null_document(rows: list[dict]) -> list[dict]:
  """The same queries as read by the same reader with the null document
  alone: rows to `compare` a model against its own no-retrieval ablation."""
  return [{'key': r['key'], 'masked_tokens': r['masked_tokens'],
           'correct_tokens': r['null_correct_tokens'],
           'log_likelihood': r['null_log_likelihood']} for r in rows]


def compare(rows_a: list[dict], rows_b: list[dict], **kwargs) -> dict:
  """A - B on the same held-out queries, each with its paired bootstrap
  interval: accuracy in points, log-likelihood in nats per masked token."""
  keys_a, keys_b = [r['key'] for r in rows_a], [r['key'] for r in rows_b]
  if keys_a != keys_b:
    first = next((i for i, (x, y) in enumerate(zip(keys_a, keys_b))
                  if x != y), min(len(keys_a), len(keys_b)))
    raise ValueError(f'The two evaluations scored different queries '
                     f'({len(keys_a)} and {len(keys_b)}; the first difference '
                     f'is query {first}).')
  column = lambda rows, t: np.array([r[t] for r in rows])
  tokens = column(rows_a, 'masked_tokens')
  return {
      'masked_token_accuracy': bootstrap.paired_interval(
          column(rows_a, 'correct_tokens'), column(rows_b, 'correct_tokens'),
          tokens, scale=100, **kwargs),
      'log_likelihood': bootstrap.paired_interval(
          column(rows_a, 'log_likelihood'), column(rows_b, 'log_likelihood'),
          tokens, **kwargs)}
