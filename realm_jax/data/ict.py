"""Inverse Cloze Task examples (Lee et al. 2019, ORQA), REALM's retriever warm start.

A random sentence of a block becomes the pseudo-query; the block is its
evidence. The sentence is removed from the block with probability 0.9, so the
retriever learns more than word overlap but still rewards it sometimes.
"""

import tensorflow as tf

REMOVE_PROBABILITY = 0.9


def ict_example(sentences: tf.RaggedTensor, seed,
                remove_probability: float = REMOVE_PROBABILITY):
  """(query, block) token ids from one block's sentences.

  Args:
    sentences: [num_sentences, (tokens)] token ids of the block's sentences.
    seed: shape [2] int seed of the stateless random ops (deterministic).
    remove_probability: chance that the query sentence leaves the block; a
      one-sentence block always keeps it.

  Returns:
    (query [(tokens)], block [(tokens)], removed: bool scalar).
  """
  seeds = tf.random.experimental.stateless_split(
      tf.cast(seed, tf.int64), num=2)
  count = sentences.nrows(out_type=tf.int32)
  index = tf.random.stateless_uniform([], seeds[0], maxval=count,
                                      dtype=tf.int32)
  removed = tf.logical_and(
      tf.random.stateless_uniform([], seeds[1]) < remove_probability,
      count > 1)
  keep = tf.logical_or(tf.range(count) != index, tf.logical_not(removed))
  block = tf.ragged.boolean_mask(sentences, keep).flat_values
  return sentences[index], block, removed
