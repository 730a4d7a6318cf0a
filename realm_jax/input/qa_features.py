"""The seqio feature converter of Open-QA tasks (the TensorFlow extra):
what a t5x-style seqio.Evaluator hands a model, and the t5x adapter extends."""

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec


class QAFeatureConverter(seqio.FeatureConverter):
  """QA task features -> model features: the question's `[CLS] x [SEP]`
  wordpieces, padded to the model's query length. Answers stay with the
  task; seqio's metrics read them from there."""
  TASK_FEATURES = {'query_token_ids': Spec(dtype=tf.int32),
                   'answer_token_ids': Spec(dtype=tf.int32, rank=2),
                   'targets': Spec(dtype=tf.int32)}
  MODEL_FEATURES = {'query_token_ids': Spec(dtype=tf.int32)}
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, pack: bool = False, **kwargs):
    if pack:
      raise ValueError('QA questions are never packed.')
    super().__init__(pack=False, **kwargs)

  def _convert_features(self, ds, task_feature_lengths):
    ds = ds.map(lambda f: {'query_token_ids': f['query_token_ids']},
                num_parallel_calls=tf.data.AUTOTUNE)
    return seqio.utils.trim_and_pad_dataset(
        ds, self.get_model_feature_lengths(task_feature_lengths))

  def get_model_feature_lengths(self, task_feature_lengths):
    return {'query_token_ids': task_feature_lengths['query_token_ids']}
