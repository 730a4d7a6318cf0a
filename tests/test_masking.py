"""Masking covers exactly the chosen wordpieces; the source block is kept."""

import os

import numpy as np
import pytest
import tensorflow as tf

from realm_jax.data import masking, salient_spans

pytestmark = pytest.mark.integration


@pytest.fixture(scope='module')
def annotated(small_corpus):
  path = os.path.join(small_corpus, 'wiki_leads', 'annotated',
                      'train.tfrecord')
  blocks = list(tf.data.TFRecordDataset(path).map(
      salient_spans.parse_annotated_block).take(12))
  assert len(blocks) == 12  # Every test below loops over them.
  return blocks


def _seed(i):
  return tf.constant([i, 3], tf.int64)


def test_salient_mask_covers_exactly_the_span(annotated, tokenizer):
  for i, block in enumerate(annotated):
    out = masking.salient_span_mask(block, _seed(i), tokenizer)
    query = out['query_token_ids'].numpy()
    positions = out['mlm_positions'].numpy()
    assert query[0] == tokenizer.cls_id and query[-1] == tokenizer.sep_id
    assert len(query) <= 96
    assert np.all(query[positions] == tokenizer.mask_id)
    assert np.sum(query == tokenizer.mask_id) == len(positions)
    assert np.all(np.diff(positions) == 1)  # One contiguous span.
    # The targets spell one of the block's salient spans.
    body = block['body'].numpy()
    spans = [body[s:e] for s, e in zip(block['span_starts'].numpy(),
                                       block['span_ends'].numpy())]
    target_text = tokenizer.detokenize(out['mlm_targets']).numpy()
    assert target_text in [tokenizer.detokenize(
        tokenizer.tokenize([s])[0]).numpy() for s in spans]
    # The trivial candidate to exclude is the query's own block.
    assert int(out['block_id']) == int(block['block_id'])


@pytest.mark.parametrize('length', [96, 24, 8])
def test_a_short_query_keeps_its_masked_span(annotated, tokenizer, length):
  """A query shorter than the annotation's 96 drops words before the span,
  never the span: every position stays inside the query, on a [MASK]."""
  moved = 0
  for i, block in enumerate(annotated):
    long = masking.salient_span_mask(block, _seed(i), tokenizer)
    out = masking.salient_span_mask(block, _seed(i), tokenizer, length)
    query, positions = (out['query_token_ids'].numpy(),
                        out['mlm_positions'].numpy())
    assert len(query) <= length and query[-1] == tokenizer.sep_id
    assert len(positions) and np.all(positions < len(query) - 1)
    assert np.all(query[positions] == tokenizer.mask_id)
    # The same span, all of it when it fits.
    targets = out['mlm_targets'].numpy()
    full = long['mlm_targets'].numpy()
    np.testing.assert_array_equal(targets, full[:length - 2])
    moved += int(long['mlm_positions'].numpy()[-1] >= length - 1)
  if length == 24:
    assert moved  # Some spans lay past 24 wordpieces and were kept.


def _sentence_tokens(block, tokenizer):
  body = block['body'].numpy()
  return [tokenizer.tokenize([body[s:e]])[0].numpy().tolist()[:94]
          for s, e in zip(block['sentence_starts'].numpy(),
                          block['sentence_ends'].numpy())]


@pytest.mark.parametrize('name', ['random_uniform', 'random_span'])
def test_random_masks_target_the_original_wordpieces(annotated, tokenizer,
                                                     name):
  rates = []
  for i, block in enumerate(annotated):
    out = masking.MASKING_FUNCTIONS[name](block, _seed(i), tokenizer)
    query = out['query_token_ids'].numpy()[1:-1]
    positions = out['mlm_positions'].numpy() - 1
    targets = out['mlm_targets'].numpy()
    original = next(s for s in _sentence_tokens(block, tokenizer)
                    if len(s) == len(query) and all(
                        s[p] == t for p, t in zip(positions, targets)))
    unmasked = np.setdiff1d(np.arange(len(query)), positions)
    np.testing.assert_array_equal(query[unmasked],
                                  np.asarray(original)[unmasked])
    rates.append(len(positions) / len(query))
    if name == 'random_span':
      assert np.all(query[positions] == tokenizer.mask_id)
      assert len(positions) <= max(1, round(0.15 * len(query)))
  assert 0.08 < np.mean(rates) < 0.25


def test_masks_are_deterministic_for_a_seed(annotated, tokenizer):
  for name, function in masking.MASKING_FUNCTIONS.items():
    a = function(annotated[0], _seed(7), tokenizer)
    b = function(annotated[0], _seed(7), tokenizer)
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=name)


@pytest.mark.usefixtures('small_corpus_env')
def test_the_pipeline_masks_queries_of_the_run_length(tokenizer):
  from realm_jax.input.seqio_source import SeqioSource  # pylint: disable=g-import-not-at-top
  shapes = {'query_token_ids': (16,), 'mlm_positions': (8,),
            'mlm_targets': (8,)}
  batches = list(SeqioSource().batches('realm_pretrain_wiki_leads_salient',
                                        'train', shapes, 8, num_epochs=1))
  assert batches  # The assertions below hold for every batch read.
  for batch in batches:
    masked = batch['mlm_targets'] != 0
    assert masked.any(axis=1).all()  # Every query masks its span.
    assert np.all(batch['mlm_positions'][masked] < 15)
    rows = np.arange(8)[:, None].repeat(8, 1)[masked]
    assert np.all(batch['query_token_ids'][rows,
                                           batch['mlm_positions'][masked]]
                  == tokenizer.mask_id)
