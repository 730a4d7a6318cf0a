"""The seqio source (the TensorFlow extra): realm-jax's seqio tasks
(`realm_jax.input.tasks`), tokenized and masked as they are read.

The data is split into `data_shards` disjoint shards (seqio.ShardInfo), each
contributing an equal slice of every global batch; each process reads only
its own shards and yields its rows of the global batch. So the global batch
depends on the seed and the number of shards, not on how many processes
read them. `SeqioSource.export` writes a task's split as the arrays the
TF-free source reads (`realm_jax.input.arrays`).
"""

import jax
import numpy as np

from realm_jax import default_files, extras
from realm_jax.data import (block_store, corpus, example_arrays,
                            masked_queries, metrics, span_arrays, task_names)
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.input.source import Questions, Source


class SeqioSource(Source):
  """The registered seqio tasks; seqio is needed only when one is read."""

  kind = 'seqio'

  def batches(self, task, split, shapes, batch_size, seed=0, shuffle=True,
              num_epochs=None, skip_batches=0, data_shards=None,
              drop_remainder=True):
    seqio = _seqio()
    tf = corpus.tensorflow()
    processes = jax.process_count()
    data_shards = data_shards or processes
    if not drop_remainder and data_shards > 1:
      raise ValueError('drop_remainder=False needs a single data shard: '
                       'short last batches of several shards do not line up.')
    if data_shards % processes or batch_size % data_shards:
      raise ValueError(f'data_shards={data_shards} must be a multiple of the '
                       f'{processes} processes and divide batch_size='
                       f'{batch_size}.')
    mine = data_shards // processes
    first = jax.process_index() * mine
    streams = [shard_batches(task, split, shapes, batch_size // data_shards,
                             seed, shuffle, num_epochs,
                             seqio.ShardInfo(index, data_shards),
                             drop_remainder)
               for index in range(first, first + mine)]
    dataset = streams[0]
    if len(streams) > 1:  # This process's rows: its shards' slices in order.
      dataset = tf.data.Dataset.zip(tuple(streams)).map(
          lambda *slices: {name: tf.concat([s[name] for s in slices], 0)
                           for name in shapes})
    return dataset.skip(skip_batches).prefetch(2).as_numpy_iterator()

  def example_count(self, task, split, shapes):
    del task, split, shapes  # Known only by reading the whole split.
    return None

  def position(self, task, data_shards):
    del task
    return {'data_shards': data_shards}

  def questions(self, task, query_length, limit=None):
    seqio = _seqio()
    # The task's metric says how its answers match: as strings or patterns.
    regex = (metrics.regex_match in
             seqio.get_mixture_or_task(task).predict_metric_fns)
    dataset = _task_dataset(task, 'test', {'query_token_ids': (query_length,)},
                            0, False, 1, keep=('question', 'answers'))
    if limit is not None:
      dataset = dataset.take(limit)
    rows = list(dataset.as_numpy_iterator())
    if not rows:
      raise ValueError(f'seqio task {task!r} has no test questions.')
    return Questions(
        [{'question': _text(r['question']),
          'answers': [_text(a) for a in r['answers']]} for r in rows],
        np.stack([r['query_token_ids'] for r in rows]), regex)

  def add_qa_file(self, path, regex):
    extras.require('seqio', 'A QA file read as a seqio task',
                   "export its arrays where TensorFlow is (realm-jax data "
                   "export) and read them (Examples.source = 'arrays')")
    from realm_jax.input.tasks import open_qa as open_qa_tasks  # pylint: disable=g-import-not-at-top
    open_qa_tasks.register_qa_file(path, regex)

  def export(self, task: str, split: str, shapes: dict[str, tuple[int, ...]],
             seed: int = 0, root: str | None = None,
             corpus_name: str | None = None, strings: tuple[str, ...] = (),
             metadata: dict | None = None) -> dict:
    """Writes a seqio task's split (one epoch, unshuffled, preprocessed with
    `seed`) as the arrays the 'arrays' source reads; `corpus_name`: the corpus
    the examples come from (its fingerprint is recorded and checked);
    `strings`: text features kept beside them (an Open-QA question and its
    answers); `metadata`: more to record (how the answers match). Returns
    the arrays' metadata, `count` the examples of an epoch.

    A pre-training task's split is its corpus's span arrays instead (written
    once for every masking; `arrays.directory`), which its queries are drawn
    from."""
    parsed = task_names.masked_lm(task)
    if parsed is not None:
      corpus_name, masking = parsed
      tokenizer = WordPieceTokenizer(default_files.task_vocab())
      span_arrays.write(corpus_name, split, tokenizer, root)
      spans = span_arrays.SpanArrays(
          span_arrays.directory(corpus_name, split, root),
          block_store.open_store(corpus.corpus_dir(corpus_name)))
      return {**spans.metadata,
              'count': masked_queries.Draws(spans, masking, tokenizer).count}
    dataset = _task_dataset(task, split, shapes, seed, False, 1, keep=strings)
    metadata = {**(metadata or {}), 'task': task, 'split': split, 'seed': seed,
                'vocab_fingerprint': corpus.vocab_hash(default_files.task_vocab())}
    if corpus_name:
      metadata['corpus_name'] = corpus_name
      metadata['corpus_fingerprint'] = corpus.load_metadata(
          corpus.corpus_dir(corpus_name))['corpus_fingerprint']
    return example_arrays.write(
        example_arrays.directory(task, split, root), dataset.as_numpy_iterator(),
        shapes, strings, **metadata)


def _seqio():
  """seqio, with realm-jax's tasks registered."""
  seqio = extras.require(
      'seqio', 'Reading a seqio task',
      "read pre-tokenized arrays: Examples.source = 'arrays' (written by "
      '`realm-jax data export` where TensorFlow is)')
  from realm_jax.input import tasks  # pylint: disable=g-import-not-at-top
  tasks.register()
  return seqio


def _fixed(tf, x, shape):
  """Pads with zeros and cuts a dense or ragged feature to `shape`. `tf`
  comes in imported: AutoGraph would follow an import here into importlib,
  whose source it cannot read, and warn."""
  if isinstance(x, tf.RaggedTensor):
    return x.to_tensor(shape=shape)
  if not shape:
    return x
  x = x[:shape[0]]
  x = tf.pad(x, [[0, shape[0] - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1))
  return tf.ensure_shape(x, shape)


def _task_dataset(task, split, shapes, seed, shuffle, num_epochs,
                  shard_info=None, keep=()):
  """A seqio task's examples, each feature of `shapes` fixed to its shape,
  and the features `keep` as they are."""
  seqio, tf = _seqio(), corpus.tensorflow()
  dataset = seqio.get_mixture_or_task(task).get_dataset(
      # The lengths preprocessors build to (e.g. masked-LM queries).
      sequence_length={name: shape[0] for name, shape in shapes.items()
                       if len(shape) == 1},
      split=split, shuffle=shuffle, seed=seed,
      num_epochs=num_epochs, use_cached=False, trim_output_features=False,
      shard_info=shard_info)
  missing = (set(shapes) | set(keep)) - set(dataset.element_spec)
  if missing:
    raise KeyError(f'Task {task!r} has no features {sorted(missing)}; it has '
                   f'{sorted(dataset.element_spec)}.')
  return dataset.map(
      lambda x: {**{name: x[name] for name in keep},
                 **{name: _fixed(tf, x[name], list(shape))
                    for name, shape in shapes.items()}},
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def shard_batches(task, split, shapes, rows, seed, shuffle, num_epochs,
                   shard_info, drop_remainder=True):
  """Batches of `rows` examples from one shard of the task."""
  dataset = _task_dataset(task, split, shapes, seed, shuffle, num_epochs,
                          shard_info)
  return dataset.batch(rows, drop_remainder=drop_remainder)


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)
