"""WordPiece tokenization and the paper's [CLS]/[SEP] joins."""

import numpy as np
import pytest

from realm_jax.data.tokenization import WordPieceTokenizer

pytestmark = pytest.mark.unit


def test_hello_world_parity_tokenization(tokenizer):
  joined = tokenizer.numpy_join(['hello world'], max_length=6)
  np.testing.assert_array_equal(joined['token_ids'][0],
                                [101, 7592, 2088, 102, 0, 0])
  np.testing.assert_array_equal(joined['input_mask'][0], [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(joined['token_type_ids'][0], [0] * 6)


def test_lower_cases(tokenizer):
  upper = tokenizer.numpy_join(['HELLO World'], max_length=6)['token_ids']
  lower = tokenizer.numpy_join(['hello world'], max_length=6)['token_ids']
  np.testing.assert_array_equal(upper, lower)


def test_pair_join_has_segment_types(tokenizer):
  joined = tokenizer.numpy_join(['hello'], ['world'], max_length=7)
  np.testing.assert_array_equal(joined['token_ids'][0],
                                [101, 7592, 102, 2088, 102, 0, 0])
  np.testing.assert_array_equal(joined['token_type_ids'][0],
                                [0, 0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(joined['input_mask'][0], [1, 1, 1, 1, 1, 0, 0])


def test_wordpieces_split_rare_words(tokenizer):
  ids = tokenizer.tokenize(['unaffable']).to_list()[0]
  pieces = [tokenizer.vocab[i] for i in ids]
  assert len(pieces) > 1 and pieces[1].startswith('##')


def test_batch_pads_each_row_to_the_budget(tokenizer):
  joined = tokenizer.numpy_join(['a', 'hello world again'], max_length=8)
  assert joined['token_ids'].shape == (2, 8)
  np.testing.assert_array_equal(joined['input_mask'].sum(axis=1), [3, 5])


@pytest.mark.parametrize('truncation,expected', [
    # Waterfall keeps the first segment whole and cuts the second.
    ('waterfall', [101, 7592, 2088, 7592, 2088, 102, 102]),
    # Longest-first shrinks the longer segment down to the shorter one.
    ('longest_first', [101, 7592, 2088, 102, 2088, 7592, 102]),
])
def test_truncation_to_the_length_budget(tokenizer, truncation, expected):
  joined = tokenizer.numpy_join(['hello world hello world'], ['world hello'],
                                max_length=7, truncation=truncation)
  np.testing.assert_array_equal(joined['token_ids'][0], expected)
  assert joined['input_mask'][0].sum() == 7


def test_too_short_budget_is_an_error(tokenizer):
  with pytest.raises(ValueError, match='max_length=2'):
    tokenizer.numpy_join(['a'], ['b'], max_length=2)


def test_unknown_truncation_is_an_error(tokenizer):
  with pytest.raises(ValueError, match='truncation'):
    tokenizer.numpy_join(['a'], max_length=8, truncation='middle')


def test_missing_vocab_names_the_file(tmp_path):
  path = tmp_path / 'no_such_vocab.txt'
  with pytest.raises(FileNotFoundError, match='no_such_vocab.txt'):
    WordPieceTokenizer(path)


def test_vocab_without_special_tokens_names_them(tmp_path):
  path = tmp_path / 'vocab.txt'
  path.write_text('[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n')
  with pytest.raises(ValueError, match=r"vocab.txt.*\[MASK\]"):
    WordPieceTokenizer(path)
