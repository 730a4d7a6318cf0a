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


def ict_features(features, seed, tokenizer, max_query_length: int = 64,
                 max_block_length: int = 288,
                 remove_probability: float = REMOVE_PROBABILITY) -> dict:
  """An ICT training pair from a corpus block (see `corpus.BLOCK_FEATURES`).

  Returns query_token_ids `[CLS] sentence [SEP]` and the block
  `[CLS] title [SEP] rest [SEP]` as block_token_ids with
  block_token_type_ids, plus block_id.
  """
  starts = features['sentence_starts']
  sentences = tf.strings.substr(features['body'], starts,
                                features['sentence_ends'] - starts)
  query, block, _ = ict_example(tokenizer.tokenize(sentences), seed,
                                remove_probability)
  title_length = tf.cast(features['title_length'], tf.int32)
  title = features['token_ids'][1:1 + title_length]
  cls = tf.constant([tokenizer.cls_id], tf.int64)
  sep = tf.constant([tokenizer.sep_id], tf.int64)
  block = block[:max_block_length - 3 - title_length]
  head = tf.concat([cls, title, sep], 0)
  tail = tf.concat([block, sep], 0)
  return {
      'query_token_ids': tf.cast(tf.concat(
          [cls, query[:max_query_length - 2], sep], 0), tf.int32),
      'block_token_ids': tf.cast(tf.concat([head, tail], 0), tf.int32),
      'block_token_type_ids': tf.concat(
          [tf.zeros_like(head, tf.int32), tf.ones_like(tail, tf.int32)], 0),
      'block_id': tf.cast(features['block_id'], tf.int32),
  }
