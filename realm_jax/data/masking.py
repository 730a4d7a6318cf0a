"""Masked-LM queries for REALM pre-training, as TensorFlow ops for seqio.

Salient span masking (the paper's): one salient span of an annotated block is
chosen; its sentence, up to `max_query_length` wordpieces, becomes the query
`[CLS] x [SEP]`, with every wordpiece of the span replaced by [MASK]. The
paper's ablations mask a random sentence instead: random uniform masks (BERT's
15%, with its 80/10/10 replacement) or random spans (SpanBERT-like: span
lengths from Geometric(0.2) clipped to 10, until 15% of the wordpieces are
masked, all replaced by [MASK]).

Every function maps one example (see `salient_spans.ANNOTATED_FEATURES`) and a
stateless seed to {query_token_ids, mlm_positions, mlm_targets, block_id}; the
block id is the trivial candidate to exclude from retrieval. The TF-free
core draws the same queries in numpy (`masked_queries`, whose constants these
are).
"""

import tensorflow as tf

from realm_jax.data.masked_queries import (MASK_RATE, MAX_RANDOM_SPAN,
                                           RANDOM_SPAN_DRAWS, SPAN_GEOMETRIC_P)
from realm_jax.data.tokenization import WordPieceTokenizer


def _substr(body, start, end):
  return tf.strings.substr(body, start, end - start)


def _sentence(features, index):
  return _substr(features['body'], features['sentence_starts'][index],
                 features['sentence_ends'][index])


def _query(tokenizer: WordPieceTokenizer, tokens, positions, targets,
           features) -> dict:
  """`[CLS] tokens [SEP]`; positions shift by one for the [CLS]."""
  cls = tf.constant([tokenizer.cls_id], tf.int64)
  sep = tf.constant([tokenizer.sep_id], tf.int64)
  return {
      'query_token_ids': tf.cast(tf.concat([cls, tokens, sep], 0), tf.int32),
      'mlm_positions': tf.cast(positions + 1, tf.int32),
      'mlm_targets': tf.cast(targets, tf.int32),
      'block_id': tf.cast(features['block_id'], tf.int32),
  }


def salient_span_mask(features, seed, tokenizer: WordPieceTokenizer,
                      max_query_length: int = 96) -> dict:
  """The paper's masking. The annotation guarantees the span fits a query of
  its `max_query_length` (96); a shorter query drops words before the span
  so that the span stays in it (and a span longer than the whole query is
  masked only as far as the query reaches)."""
  count = tf.size(features['span_starts'], out_type=tf.int32)
  index = tf.random.stateless_uniform([], seed, maxval=count, dtype=tf.int32)
  return mask_salient_span(features, index, tokenizer, max_query_length)


def every_salient_span(features, tokenizer: WordPieceTokenizer,
                       max_query_length: int = 96) -> tf.data.Dataset:
  """One query per salient span of the block, in order: held-out sets that
  score every span once, the same for every model."""
  count = tf.size(features['span_starts'], out_type=tf.int64)
  return tf.data.Dataset.range(count).map(
      lambda index: mask_salient_span(features, index, tokenizer,
                                      max_query_length))


def mask_salient_span(features, index, tokenizer: WordPieceTokenizer,
                      max_query_length: int = 96) -> dict:
  """The query of the block's salient span number `index` (see
  `salient_span_mask`)."""
  sentence = features['span_sentences'][index]
  start, end = features['span_starts'][index], features['span_ends'][index]
  body = features['body']
  pieces = tokenizer.tokenize(tf.stack([
      _substr(body, features['sentence_starts'][sentence], start),
      _substr(body, start, end),
      _substr(body, end, features['sentence_ends'][sentence])]))
  before, span, after = pieces[0], pieces[1], pieces[2]
  keep = max_query_length - 2  # Wordpieces between [CLS] and [SEP].
  span = span[:keep]
  span_length = tf.size(span, out_type=tf.int64)
  before = before[tf.maximum(tf.size(before, out_type=tf.int64) + span_length
                             - keep, 0):]
  masks = tf.fill([span_length], tf.constant(tokenizer.mask_id, tf.int64))
  tokens = tf.concat([before, masks, after], 0)[:keep]
  positions = tf.size(before, out_type=tf.int64) + tf.range(span_length)
  return _query(tokenizer, tokens, positions, span, features)


def _random_sentence(features, seed, tokenizer, max_query_length):
  count = tf.size(features['sentence_starts'], out_type=tf.int32)
  index = tf.random.stateless_uniform([], seed, maxval=count, dtype=tf.int32)
  tokens = tokenizer.tokenize(tf.reshape(_sentence(features, index), [1]))[0]
  return tokens[:max_query_length - 2]


def random_uniform_mask(features, seed, tokenizer: WordPieceTokenizer,
                        max_query_length: int = 96) -> dict:
  """BERT's masking of a random sentence: 15%, 80% [MASK] / 10% random / 10% kept."""
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
  tokens = _random_sentence(features, seeds[0], tokenizer, max_query_length)
  length = tf.size(tokens)
  count = tf.maximum(1, tf.cast(tf.round(MASK_RATE * tf.cast(length, tf.float32)),
                                tf.int32))
  order = tf.argsort(tf.random.stateless_uniform([length], seeds[1]))
  positions = tf.cast(tf.sort(order[:count]), tf.int64)
  targets = tf.gather(tokens, positions)
  draw = tf.random.stateless_uniform([count], seeds[2])
  random_ids = tf.random.stateless_uniform(
      [count], seeds[3], minval=tokenizer.first_regular_id,
      maxval=tokenizer.vocab_size, dtype=tf.int64)
  replacement = tf.where(draw < 0.8, tf.constant(tokenizer.mask_id, tf.int64),
                         tf.where(draw < 0.9, random_ids, targets))
  tokens = tf.tensor_scatter_nd_update(tokens, positions[:, None], replacement)
  return _query(tokenizer, tokens, positions, targets, features)


def random_span_mask(features, seed, tokenizer: WordPieceTokenizer,
                     max_query_length: int = 96) -> dict:
  """SpanBERT-like masking of a random sentence (see the module docstring)."""
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 3)
  tokens = _random_sentence(features, seeds[0], tokenizer, max_query_length)
  length = tf.size(tokens)
  budget = tf.maximum(1, tf.cast(tf.round(MASK_RATE * tf.cast(length,
                                                              tf.float32)),
                                 tf.int32))
  uniform = tf.random.stateless_uniform([RANDOM_SPAN_DRAWS], seeds[1],
                                        minval=1e-6, maxval=1.0)
  span_lengths = tf.clip_by_value(
      1 + tf.cast(tf.math.log(uniform) / tf.math.log(1 - SPAN_GEOMETRIC_P),
                  tf.int32), 1, MAX_RANDOM_SPAN)
  starts = tf.random.stateless_uniform([RANDOM_SPAN_DRAWS], seeds[2],
                                       maxval=length, dtype=tf.int32)
  position = tf.range(length)
  covered = tf.zeros([length], tf.bool)
  for draw in range(RANDOM_SPAN_DRAWS):  # Spans are added while they fit.
    grown = covered | ((position >= starts[draw]) &
                       (position < starts[draw] + span_lengths[draw]))
    fits = tf.reduce_sum(tf.cast(grown, tf.int32)) <= budget
    covered = tf.where(fits, grown, covered)
  # Spans longer than a short sentence's budget: mask one wordpiece instead.
  covered = tf.where(tf.reduce_any(covered), covered,
                     tf.equal(position, starts[0]))
  positions = tf.cast(tf.where(covered)[:, 0], tf.int64)
  targets = tf.gather(tokens, positions)
  tokens = tf.where(covered, tf.constant(tokenizer.mask_id, tf.int64), tokens)
  return _query(tokenizer, tokens, positions, targets, features)


MASKING_FUNCTIONS = {
    'salient': salient_span_mask,
    'random_uniform': random_uniform_mask,
    'random_span': random_span_mask,
}
