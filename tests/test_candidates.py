"""Candidate selection, gathering and reader inputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import candidates
from realm_jax.models.candidates import NULL_DOCUMENT_ID as NULL

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('xp', [np, jnp], ids=['host', 'device'])
def test_null_first_trivial_and_duplicates_dropped_then_padded(xp):
  retrieved = np.array([[7, 3, 7, 9, 4],     # 3 is the query's source block.
                        [5, 5, 5, -1, -1],   # Duplicates and padding.
                        [-1, -1, -1, -1, -1]])  # Retrieval found nothing.
  ids, mask = candidates.select_candidates(retrieved, np.array([3, -1, 2]), 4,
                                           xp)
  # On the host, numpy: nothing queued on a device behind the train step.
  assert isinstance(ids, np.ndarray) == (xp is np)
  np.testing.assert_array_equal(ids, [[NULL, 7, 9, 4],
                                      [NULL, 5, NULL, NULL],
                                      [NULL, NULL, NULL, NULL]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 1], [1, 1, 0, 0],
                                       [1, 0, 0, 0]])


@pytest.mark.parametrize('xp', [np, jnp], ids=['host', 'device'])
def test_too_few_retrieved_are_padded(xp):
  ids, mask = candidates.select_candidates(np.array([[4]]), np.array([-1]), 3,
                                           xp)
  np.testing.assert_array_equal(ids, [[NULL, 4, NULL]])
  np.testing.assert_array_equal(mask, [[1, 1, 0]])


def _blocks(tokenizer, titles, bodies, length):
  return tokenizer.numpy_join(titles, bodies, max_length=length)


@pytest.mark.parametrize('xp', [np, jnp], ids=['host', 'device'])
def test_gather_blocks_puts_the_null_document_at_null_ids(tokenizer, xp):
  corpus = _blocks(tokenizer, ['Paris', 'Rome'], ['capital of france',
                                                  'capital of italy'], 12)
  null = candidates.null_document(12, tokenizer.cls_id, tokenizer.sep_id)
  got = candidates.gather_blocks(corpus, np.array([[NULL, 1, 0]]), null, xp)
  assert all(isinstance(v, np.ndarray) == (xp is np) for v in got.values())
  np.testing.assert_array_equal(got['token_ids'][0, 1], corpus['token_ids'][1])
  np.testing.assert_array_equal(got['token_ids'][0, 2], corpus['token_ids'][0])
  np.testing.assert_array_equal(got['token_ids'][0, 0, :4],
                                [tokenizer.cls_id, tokenizer.sep_id,
                                 tokenizer.sep_id, 0])
  np.testing.assert_array_equal(got['token_type_ids'][0, 0, :4], [0, 0, 1, 0])


@pytest.mark.parametrize('max_length', [32, 14, 9])  # Fits; cut z; z gone.
def test_reader_inputs_equal_the_tokenizer_join(tokenizer, max_length):
  questions = ['who was the first emperor?', 'where is rome?']
  titles = ['Augustus', 'Rome', 'Colosseum']
  bodies = ['augustus was the first roman emperor',
            'rome is the capital city of italy', 'an amphitheatre in rome']
  query = tokenizer.numpy_join(questions, max_length=10)
  blocks = _blocks(tokenizer, titles, bodies, 16)
  stacked = {k: np.stack([v, v[::-1]]) for k, v in blocks.items()}  # [2, 3, L]
  got = candidates.join_query_and_blocks(query, stacked, max_length)
  for b, question in enumerate(questions):
    for z in range(3):
      body = bodies[z] if b == 0 else bodies[::-1][z]
      expected = tokenizer.numpy_join([question], [body], max_length=max_length)
      for key in ('token_ids', 'token_type_ids', 'input_mask'):
        np.testing.assert_array_equal(got[key][b, z], expected[key][0],
                                      err_msg=f'{key} {b} {z}')
      z_tokens = (expected['token_type_ids'][0] == 1) & (
          expected['token_ids'][0] != tokenizer.sep_id)
      np.testing.assert_array_equal(got['block_mask'][b, z], z_tokens)


def test_reader_inputs_with_the_title(tokenizer):
  query = tokenizer.numpy_join(['where is rome?'], max_length=8)
  blocks = _blocks(tokenizer, ['Rome'], ['capital of italy'], 12)
  got = candidates.join_query_and_blocks(
      query, {k: v[:, None] for k, v in blocks.items()}, 16,
      include_title=True)
  expected = tokenizer.numpy_join(['where is rome?'], ['Rome'],
                                  ['capital of italy'], max_length=16)
  np.testing.assert_array_equal(got['token_ids'][0, 0], expected['token_ids'][0])
  np.testing.assert_array_equal(got['input_mask'][0, 0],
                                expected['input_mask'][0])
  # Title and body are both z: token type 1, answer spans may lie in either.
  np.testing.assert_array_equal(got['token_type_ids'][0, 0],
                                expected['token_type_ids'][0] > 0)
