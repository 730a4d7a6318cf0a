"""Fixed-shape numpy batches of a task, in a deterministic order, from one of
two sources (`Examples.source`):

- 'seqio' (the TensorFlow extra): the registered seqio task, tokenized and
  masked as it is read. The data is split into `data_shards` disjoint shards
  (seqio.ShardInfo), each contributing an equal slice of every global batch;
  each process reads only its own shards and yields its rows of the global
  batch. So the global batch depends on the seed and the number of shards,
  not on how many processes read them.
- 'arrays' (the TF-free core): the same examples, pre-tokenized by `export`
  into memory-mapped arrays (`data.example_arrays`), permuted by the seed
  epoch by epoch; the global batch depends on the seed alone. Pre-training
  queries are not exported masked: `export` writes the corpus's sentences
  and salient spans (`data.span_arrays`), and each query is drawn when its
  batch is made, from the seed and its position in the stream
  (`data.masked_queries`).

Either way a run resumed after b batches reads from batch b on, so resumes
are exact.
"""

from typing import Iterator

import gin
import jax
import numpy as np
from etils import epath

from realm_jax import embedded, errors, extras
from realm_jax.data import (block_store, corpus, example_arrays,
                            masked_queries, span_arrays, task_names)
from realm_jax.data.tokenization import WordPieceTokenizer

SOURCES = ('seqio', 'arrays')


@gin.configurable
class Examples:
  """Where a run's examples come from.

  Attributes:
    source: 'seqio' (the seqio tasks; needs the TensorFlow extra) or
      'arrays' (pre-tokenized arrays, `realm-jax data export`).
    arrays_dir: the arrays' root (default $REALM_ARRAYS_DIR, else
      runs/arrays), holding <task>/<split>/.
  """

  def __init__(self, source: str = 'seqio', arrays_dir: str | None = None):
    if source not in SOURCES:
      raise errors.BadConfig(f'Examples.source={source!r}; expected one of '
                             f'{SOURCES}.')
    self.source, self.arrays_dir = source, arrays_dir

  def position(self, task: str, data_shards: int) -> dict:
    """What, besides the task, seed and batch size, decides which examples a
    training run reads in which order: seqio's shards; else the source and
    the arrays' own fingerprint (arrays exported again may hold other
    examples; spans written again, other queries), whatever the number of
    processes."""
    if self.source == 'seqio':
      return {'data_shards': data_shards}
    draws = self.draws(task, 'train')
    if draws is not None:
      return {'source': self.source,
              'spans_fingerprint': draws.spans.metadata['fingerprint']}
    metadata = example_arrays.ExampleArrays(example_arrays.directory(
        task, 'train', self.arrays_dir)).metadata
    return {'source': self.source,
            'arrays_fingerprint': metadata['fingerprint']}

  def draws(self, task: str, split: str) -> masked_queries.Draws | None:
    """A pre-training task's queries, drawn from its corpus's span arrays
    where those are (checked against the vocabulary and the corpus); None
    for examples exported under the task's own name (every other task, and
    the controlled world's queries, `data.world`)."""
    parsed = task_names.masked_lm(task)
    if parsed is None:
      return None
    corpus_name, masking = parsed
    path = span_arrays.directory(corpus_name, split, self.arrays_dir)
    if not (path / example_arrays.METADATA).is_file():
      return None
    corpus_dir = corpus.corpus_dir(corpus_name)
    spans = span_arrays.SpanArrays(path, block_store.open_store(corpus_dir))
    spans.check(
        vocab_fingerprint=corpus.vocab_hash(embedded.task_vocab()),
        corpus_fingerprint=corpus.load_metadata(corpus_dir)[
            'corpus_fingerprint'])
    return masked_queries.Draws(spans, masking,
                                WordPieceTokenizer(embedded.task_vocab()))

  def open_arrays(self, task: str, split: str, shapes: dict
                  ) -> example_arrays.ExampleArrays:
    """A split's arrays, checked against the run's shapes, the vocabulary
    and (for a corpus's task) the corpus as it is now."""
    arrays = example_arrays.ExampleArrays(
        example_arrays.directory(task, split, self.arrays_dir))
    expected = {'vocab_fingerprint': corpus.vocab_hash(embedded.task_vocab())}
    if arrays.metadata.get('corpus_name'):
      expected['corpus_fingerprint'] = corpus.load_metadata(corpus.corpus_dir(
          arrays.metadata['corpus_name']))['corpus_fingerprint']
    arrays.check(shapes, **expected)
    return arrays


def batches(task: str, split: str, shapes: dict[str, tuple[int, ...]],
            batch_size: int, seed: int = 0, shuffle: bool = True,
            num_epochs: int | None = None, skip_batches: int = 0,
            data_shards: int | None = None, drop_remainder: bool = True
            ) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of each global batch of `batch_size` examples.

  Args:
    task: a task's name: a registered seqio task, or its exported arrays.
    split: e.g. 'train' or 'validation'.
    shapes: feature -> fixed per-example shape; other features are dropped.
    batch_size: the global batch; divided over the shards (processes).
    seed: shuffle and preprocessing seed (masking, ICT's sentence choice;
      arrays hold the preprocessing of the seed they were exported with,
      pre-training queries drawn from span arrays are masked with this one).
    shuffle: False for evaluation.
    num_epochs: None repeats forever.
    skip_batches: global batches already consumed (resume).
    data_shards: (seqio) disjoint shards of the data (default: one per
      process); a multiple of the process count that divides `batch_size`.
    drop_remainder: False keeps a short last batch (one data shard only:
      scoring every held-out example).
  """
  examples = Examples()
  if examples.source == 'arrays':
    draws = examples.draws(task, split)
    if draws is not None:
      return masked_queries.batches(
          draws, shapes, batch_size, seed, shuffle, num_epochs, skip_batches,
          jax.process_index(), jax.process_count(), drop_remainder)
    return example_arrays.batches(
        examples.open_arrays(task, split, shapes), shapes, batch_size, seed,
        shuffle, num_epochs, skip_batches, jax.process_index(),
        jax.process_count(), drop_remainder)
  return _seqio_batches(task, split, shapes, batch_size, seed, shuffle,
                        num_epochs, skip_batches, data_shards, drop_remainder)


def example_count(task: str, split: str, shapes: dict) -> int | None:
  """How many examples a split has, where that is known without reading it
  (exported arrays); None for a seqio task."""
  examples = Examples()
  if examples.source == 'arrays':
    draws = examples.draws(task, split)
    if draws is not None:
      return draws.count
    return examples.open_arrays(task, split, shapes).count
  return None


def _seqio():
  """seqio, with realm-jax's tasks registered."""
  seqio = extras.require(
      'seqio', 'Reading a seqio task',
      "read pre-tokenized arrays: Examples.source = 'arrays' (written by "
      '`realm-jax data export` where TensorFlow is)')
  import tasks  # pylint: disable=g-import-not-at-top,unused-import
  return seqio


def _seqio_batches(task, split, shapes, batch_size, seed, shuffle,
                   num_epochs, skip_batches, data_shards, drop_remainder):
  seqio = _seqio()
  tf = corpus.tensorflow()
  processes = jax.process_count()
  data_shards = data_shards or processes
  if not drop_remainder and data_shards > 1:
    raise ValueError('drop_remainder=False needs a single data shard: short '
                     'last batches of several shards do not line up.')
  if data_shards % processes or batch_size % data_shards:
    raise ValueError(f'data_shards={data_shards} must be a multiple of the '
                     f'{processes} processes and divide batch_size='
                     f'{batch_size}.')
  mine = data_shards // processes
  first = jax.process_index() * mine
  streams = [_shard_batches(task, split, shapes, batch_size // data_shards,
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


def _shard_batches(task, split, shapes, rows, seed, shuffle, num_epochs,
                   shard_info, drop_remainder=True):
  """Batches of `rows` examples from one shard of the task."""
  dataset = _task_dataset(task, split, shapes, seed, shuffle, num_epochs,
                          shard_info)
  return dataset.batch(rows, drop_remainder=drop_remainder)


def export(task: str, split: str, shapes: dict[str, tuple[int, ...]],
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
  once for every masking; `arrays_directory`), which its queries are drawn
  from."""
  parsed = task_names.masked_lm(task)
  if parsed is not None:
    corpus_name, masking = parsed
    tokenizer = WordPieceTokenizer(embedded.task_vocab())
    span_arrays.write(corpus_name, split, tokenizer, root)
    spans = span_arrays.SpanArrays(
        span_arrays.directory(corpus_name, split, root),
        block_store.open_store(corpus.corpus_dir(corpus_name)))
    return {**spans.metadata,
            'count': masked_queries.Draws(spans, masking, tokenizer).count}
  dataset = _task_dataset(task, split, shapes, seed, False, 1, keep=strings)
  metadata = {**(metadata or {}), 'task': task, 'split': split, 'seed': seed,
              'vocab_fingerprint': corpus.vocab_hash(embedded.task_vocab())}
  if corpus_name:
    metadata['corpus_name'] = corpus_name
    metadata['corpus_fingerprint'] = corpus.load_metadata(
        corpus.corpus_dir(corpus_name))['corpus_fingerprint']
  return example_arrays.write(
      example_arrays.directory(task, split, root), dataset.as_numpy_iterator(),
      shapes, strings, **metadata)


def arrays_directory(task: str, split: str, root: str | None = None
                     ) -> epath.Path:
  """Where `export` writes a task's split: for a pre-training task, its
  corpus's span arrays."""
  parsed = task_names.masked_lm(task)
  if parsed is not None:
    return span_arrays.directory(parsed[0], split, root)
  return example_arrays.directory(task, split, root)
