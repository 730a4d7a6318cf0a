"""ict_<corpus>: Inverse Cloze Task pairs for the retriever's warm start."""

import functools

import seqio
import tensorflow as tf

from realm_jax.data import corpus as corpus_lib
from realm_jax.data import ict
from realm_jax.data import salient_spans, task_names
from realm_jax.input.tasks import common

VALIDATION_PER_MILLE = 10


def blocks(corpus: str, split: str, shuffle_files: bool = False,
           seed: int | None = None) -> tf.data.Dataset:
  """The corpus' blocks; validation is the same id subset as the annotation's."""
  paths = corpus_lib.shard_paths(corpus_lib.corpus_dir(corpus))
  files = tf.data.Dataset.from_tensor_slices(paths)
  if shuffle_files:
    files = files.shuffle(len(paths), seed=seed)
  dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=1).map(
      corpus_lib.block_parser())
  in_validation = lambda x: salient_spans.is_validation(x['block_id'],
                                                       VALIDATION_PER_MILLE)
  if split == 'validation':
    return dataset.filter(in_validation)
  return dataset.filter(lambda x: tf.logical_not(in_validation(x)))


@seqio.map_over_dataset(num_seeds=1)
def ict_preprocessor(features, seed):
  return ict.ict_features(features, seed, common.vocabulary().tokenizer)


OUTPUT_FEATURES = {
    'query_token_ids': common.token_feature(),
    'block_token_ids': common.token_feature(),
    'block_token_type_ids': common.int_feature(),
    'block_id': common.int_feature(rank=0),
}


def register(corpus: str) -> None:
  common.add_task(
      task_names.ict(corpus),
      source=seqio.FunctionDataSource(functools.partial(blocks, corpus),
                                      splits=('train', 'validation')),
      preprocessors=[ict_preprocessor],
      output_features=OUTPUT_FEATURES)

