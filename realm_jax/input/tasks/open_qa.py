"""nq_open, web_questions, curated_trec: Open-QA with the papers' metrics.

Any other Open-QA file becomes a task of its own through `register_qa_file`,
so that `realm-jax eval`, fine-tuning and t5x-style evaluation read it by
name as they read the benchmarks.
"""

import functools

import seqio
import tensorflow as tf

from realm_jax.data import metrics, open_qa
from realm_jax.input.tasks import common


def examples(benchmark: str, split: str, shuffle_files: bool = False,
             seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed  # Small files; seqio shuffles examples.
  return _dataset(open_qa.load(benchmark, split, open_qa.data_dir()))


def file_examples(path: str, regex: bool, split: str,
                  shuffle_files: bool = False,
                  seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed  # As `examples`.
  return _dataset(open_qa.load_file(path, regex, split))


def _dataset(rows) -> tf.data.Dataset:
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
          [cls, question[:open_qa.MAX_QUERY_LENGTH - 2], sep], 0), tf.int32),
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


# The benchmarks `register` knows by name.
BENCHMARKS = tuple(open_qa.FILES)

OUTPUT_FEATURES = {
    'query_token_ids': common.token_feature(),
    'answer_token_ids': common.int_feature(rank=2),
    'targets': common.token_feature(),
}


def _add(name: str, dataset_fn, splits, regex: bool) -> None:
  common.add_task(
      name,
      source=seqio.FunctionDataSource(dataset_fn, splits=splits),
      preprocessors=[tokenize_question],
      output_features=OUTPUT_FEATURES,
      postprocess_fn=answers_postprocessor,
      metric_fns=[metrics.regex_match if regex else metrics.exact_match])


def register(benchmark: str) -> None:
  _add(benchmark, functools.partial(examples, benchmark), ('train', 'test'),
       benchmark in open_qa.REGEX_ANSWERS)


def register_qa_file(path: str, regex: bool = False) -> str:
  """Registers an Open-QA file (`open_qa.load_file`) as a seqio task, once,
  and returns its name (`open_qa.qa_file_task_name`).

  Its splits are `open_qa.QA_FILE_SPLITS`: 'test' every question, 'train'
  and 'validation' a fixed partition of them. `regex`: the answers are
  patterns, scored by regex match. A file of no known format is refused
  here (ValueError naming its file and line), before anything reads it.
  """
  name = open_qa.qa_file_task_name(path, regex)
  if name not in seqio.TaskRegistry.names():
    open_qa.qa_file_format(path)
    _add(name, functools.partial(file_examples, str(path), regex),
         open_qa.QA_FILE_SPLITS, regex)
  return name

