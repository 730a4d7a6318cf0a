"""ICT examples: the query is a sentence of the block, removed 90% of the time."""

import pytest
import tensorflow as tf

from realm_jax.data.ict import ict_example

pytestmark = pytest.mark.unit

SENTENCES = [[11, 12, 13], [21, 22], [31, 32, 33, 34], [41]]


_traced = tf.function(ict_example)  # One trace, a thousand cheap calls.


def _example(seed, sentences=SENTENCES):
  query, block, removed = _traced(tf.ragged.constant(sentences, tf.int64),
                                  tf.constant([seed, 7]))
  return list(query.numpy()), list(block.numpy()), bool(removed)


def test_query_is_removed_from_its_block_about_ninety_percent_of_the_time():
  removed_count = 0
  for seed in range(1000):
    query, block, removed = _example(seed)
    assert query in SENTENCES
    rest = [s for s in SENTENCES if s != query or not removed]
    assert block == sum(rest, [])
    removed_count += removed
  # Binomial(1000, 0.9): sd ~ 9.5, so +-40 is over 4 sd.
  assert 860 <= removed_count <= 940


def test_every_sentence_can_be_the_query():
  queries = {tuple(_example(seed)[0]) for seed in range(200)}
  assert queries == {tuple(s) for s in SENTENCES}


def test_deterministic_for_a_seed():
  assert _example(5) == _example(5)


def test_a_single_sentence_block_keeps_its_sentence():
  for seed in range(20):
    query, block, removed = _example(seed, [[1, 2, 3]])
    assert query == block == [1, 2, 3] and not removed
