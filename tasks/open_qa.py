"""nq_open, web_questions, curated_trec: Open-QA with the papers' metrics."""

import functools

import seqio
import tensorflow as tf

from realm_jax.data import open_qa
from realm_jax.evaluation import metrics
from tasks import common

MAX_QUERY_LENGTH = 64


def examples(benchmark: str, split: str, shuffle_files: bool = False,
             seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed  # Small files; seqio shuffles examples.
  rows = open_qa.load(benchmark, split, open_qa.data_dir())
  return tf.data.Dataset.from_generator(
      lambda: ({'question': q, 'answers': list(a)} for q, a in rows),
      output_signature={'question': tf.TensorSpec([], tf.string),
                        'answers': tf.TensorSpec([None], tf.string)})


@seqio.map_over_dataset
def tokenize_question(features):
  """query `[CLS] question [SEP]`, answer wordpieces, and a 'targets' feature.

  targets (the first answer's wordpieces) lets t5x-style evaluators find the
  references; `answers_postprocessor` then hands them every answer. Its text,
  targets_pretokenized, spares seqio from decoding it back.
  """
  tokenizer = common.vocabulary().tokenizer
  question = tokenizer.tokenize(tf.reshape(features['question'], [1]))[0]
  answers = tokenizer.tokenize(features['answers'])
  cls = tf.constant([tokenizer.cls_id], tf.int64)
  sep = tf.constant([tokenizer.sep_id], tf.int64)
  return {
      **features,
      'query_token_ids': tf.cast(tf.concat(
          [cls, question[:MAX_QUERY_LENGTH - 2], sep], 0), tf.int32),
      'answer_token_ids': tf.cast(answers, tf.int32),
      'targets': tf.cast(answers[0], tf.int32),
      'targets_pretokenized': features['answers'][0],
  }


def answers_postprocessor(output, example=None, is_target=False):
  """References are every answer of the example; predictions pass through."""
  if is_target:
    return [a.decode('utf-8') if isinstance(a, bytes) else a
            for a in example['answers']]
  return output


OUTPUT_FEATURES = {
    'query_token_ids': common.token_feature(),
    'answer_token_ids': common.int_feature(rank=2),
    'targets': common.token_feature(),
}


def register(benchmark: str) -> None:
  metric = (metrics.regex_match if benchmark in open_qa.REGEX_ANSWERS
            else metrics.exact_match)
  seqio.TaskRegistry.add(
      benchmark,
      source=seqio.FunctionDataSource(
          functools.partial(examples, benchmark), splits=('train', 'test')),
      preprocessors=[tokenize_question],
      output_features=OUTPUT_FEATURES,
      postprocess_fn=answers_postprocessor,
      metric_fns=[metric])


for _benchmark in open_qa.FILES:
  register(_benchmark)
