"""Fixed-shape numpy batches from a seqio task, in a deterministic order.

The data is split into `data_shards` disjoint shards (seqio.ShardInfo), each
contributing an equal slice of every global batch; each process reads only
its own shards and yields its rows of the global batch. So the global batch
depends on the seed and the number of shards, not on how many processes read
them: a run resumed on another number of hosts (or a 2-process test against a
1-process one) sees the same examples in the same order, and a resumed run
skips the batches it already consumed.
"""

from typing import Iterator

import jax
import numpy as np
import seqio
import tensorflow as tf

import tasks  # pylint: disable=unused-import  (registers the seqio tasks)


def _fixed(x, shape):
  """Pads with zeros and cuts a dense or ragged feature to `shape`."""
  if isinstance(x, tf.RaggedTensor):
    return x.to_tensor(shape=shape)
  if not shape:
    return x
  x = x[:shape[0]]
  x = tf.pad(x, [[0, shape[0] - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1))
  return tf.ensure_shape(x, shape)


def batches(task: str, split: str, shapes: dict[str, tuple[int, ...]],
            batch_size: int, seed: int = 0, shuffle: bool = True,
            num_epochs: int | None = None, skip_batches: int = 0,
            data_shards: int | None = None, drop_remainder: bool = True
            ) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of each global batch of `batch_size` examples.

  Args:
    task: a registered seqio task or mixture.
    split: e.g. 'train' or 'validation'.
    shapes: feature -> fixed per-example shape; other features are dropped.
    batch_size: the global batch; divided over the shards.
    seed: shuffle and preprocessing seed (masking, ICT's sentence choice).
    shuffle: False for evaluation.
    num_epochs: None repeats forever.
    skip_batches: global batches already consumed (resume).
    data_shards: disjoint shards of the data (default: one per process);
      a multiple of the process count that divides `batch_size`.
    drop_remainder: False keeps a short last batch (one data shard only:
      scoring every held-out example).
  """
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


def _shard_batches(task, split, shapes, rows, seed, shuffle, num_epochs,
                   shard_info, drop_remainder=True) -> tf.data.Dataset:
  """Batches of `rows` examples from one shard of the task."""
  dataset = seqio.get_mixture_or_task(task).get_dataset(
      # The lengths preprocessors build to (e.g. masked-LM queries).
      sequence_length={name: shape[0] for name, shape in shapes.items()
                       if len(shape) == 1},
      split=split, shuffle=shuffle, seed=seed,
      num_epochs=num_epochs, use_cached=False, trim_output_features=False,
      shard_info=shard_info)
  missing = set(shapes) - set(dataset.element_spec)
  if missing:
    raise KeyError(f'Task {task!r} has no features {sorted(missing)}; it has '
                   f'{sorted(dataset.element_spec)}.')
  dataset = dataset.map(
      lambda x: {name: _fixed(x[name], list(shape))
                 for name, shape in shapes.items()},
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return dataset.batch(rows, drop_remainder=drop_remainder)
