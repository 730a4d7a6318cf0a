"""realm_pretrain_<corpus>_<masking>: REALM's masked-LM queries."""

import functools
import os

import seqio
import tensorflow as tf
from etils import epath

from realm_jax import errors
from realm_jax.data import corpus as corpus_lib
from realm_jax.data import masking
from realm_jax.data import salient_spans, task_names
from realm_jax.input.tasks import common


def annotated_blocks(corpus: str, split: str, shuffle_files: bool = False,
                     seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed  # One file per split; seqio shuffles examples.
  directory = corpus_lib.corpus_dir(corpus)
  path = os.path.join(directory, salient_spans.ANNOTATED_DIR,
                      f'{split}.tfrecord')
  if not epath.Path(path).exists():
    raise errors.NotFound(
        f'No annotated corpus at {path}: run `realm-jax data build-corpus` '
        f'and `realm-jax data annotate --corpus_dir={directory}`.')
  return tf.data.TFRecordDataset(path).map(
      salient_spans.parse_annotated_block)


def mask_preprocessor(name: str):
  """Masking `name`, its queries as long as sequence_length's
  'query_token_ids' (default 96): a query cut afterwards would lose
  masked positions."""
  function = masking.MASKING_FUNCTIONS[name]

  def preprocess(dataset, sequence_length=None):
    length = (sequence_length or {}).get('query_token_ids',
                                         salient_spans.MAX_QUERY_LENGTH)

    @seqio.map_over_dataset(num_seeds=1)
    def mask(features, seed):
      return function(features, seed, common.vocabulary().tokenizer, length)

    return mask(dataset)

  return preprocess


def every_span_preprocessor(dataset, sequence_length=None):
  """Every salient span of every block, one query each."""
  length = (sequence_length or {}).get('query_token_ids',
                                       salient_spans.MAX_QUERY_LENGTH)
  tokenizer = common.vocabulary().tokenizer
  return dataset.flat_map(
      lambda features: masking.every_salient_span(features, tokenizer, length))


OUTPUT_FEATURES = {
    'query_token_ids': common.token_feature(),
    'mlm_positions': common.int_feature(),
    'mlm_targets': common.token_feature(),
    'block_id': common.int_feature(rank=0),
}


def register(corpus: str) -> None:
  for name in task_names.MASKINGS:
    common.add_task(
        task_names.pretrain(corpus, name),
        source=seqio.FunctionDataSource(
            functools.partial(annotated_blocks, corpus),
            splits=('train', 'validation')),
        preprocessors=[mask_preprocessor(name)],
        output_features=OUTPUT_FEATURES)
  # Held-out scoring: the same queries for every model and masking.
  common.add_task(
      task_names.held_out(corpus),
      source=seqio.FunctionDataSource(
          functools.partial(annotated_blocks, corpus), splits=('validation',)),
      preprocessors=[every_span_preprocessor],
      output_features=OUTPUT_FEATURES)

