"""Fixed-shape numpy batches from a seqio task, in a deterministic order.

Each process reads its own shard of the task (seqio.ShardInfo) and yields its
rows of the global batch. The order depends only on the seed, so a resumed run
skips the batches it already consumed and sees exactly what an uninterrupted
run would have seen.
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
            num_epochs: int | None = None, skip_batches: int = 0
            ) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of each global batch of `batch_size` examples.

  Args:
    task: a registered seqio task or mixture.
    split: e.g. 'train' or 'validation'.
    shapes: feature -> fixed per-example shape; other features are dropped.
    batch_size: the global batch; divided over the processes.
    seed: shuffle and preprocessing seed (masking, ICT's sentence choice).
    shuffle: False for evaluation.
    num_epochs: None repeats forever.
    skip_batches: global batches already consumed (resume).
  """
  if batch_size % jax.process_count():
    raise ValueError(f'batch_size={batch_size} must divide over '
                     f'{jax.process_count()} processes.')
  dataset = seqio.get_mixture_or_task(task).get_dataset(
      sequence_length=None, split=split, shuffle=shuffle, seed=seed,
      num_epochs=num_epochs, use_cached=False, trim_output_features=False,
      shard_info=seqio.ShardInfo(jax.process_index(), jax.process_count()))
  missing = set(shapes) - set(dataset.element_spec)
  if missing:
    raise KeyError(f'Task {task!r} has no features {sorted(missing)}; it has '
                   f'{sorted(dataset.element_spec)}.')
  dataset = dataset.map(
      lambda x: {name: _fixed(x[name], list(shape))
                 for name, shape in shapes.items()},
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  dataset = dataset.batch(batch_size // jax.process_count(),
                          drop_remainder=True)
  return dataset.skip(skip_batches).prefetch(2).as_numpy_iterator()
