"""WordPiece tokenization and the input joins of the REALM paper.

Queries are `[CLS] x [SEP]`, documents `[CLS] title [SEP] body [SEP]` and reader
inputs `[CLS] x [SEP] z_body [SEP]`. Everything is TensorFlow ops
(tensorflow-text), so the same code runs inside seqio/tf.data pipelines and,
through `numpy_join`, in eager callers such as the CLI.
"""

import os
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from etils import epath

from realm_jax import errors

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
_TRIMMERS = {
    # Drops the tail of the last segment first: the body of a block, never the
    # query in front of it.
    'waterfall': tf_text.WaterfallTrimmer,
    # BERT's longest-first truncation.
    'longest_first': tf_text.ShrinkLongestTrimmer,
}


class WordPieceTokenizer:
  """Uncased (by default) BERT WordPiece over a `vocab.txt`, one token a line."""

  def __init__(self, vocab_path, lower_case: bool = True):
    vocab_path = os.fspath(vocab_path)
    if not epath.Path(vocab_path).is_file():
      raise errors.NotFound(f'WordPiece vocab file not found: {vocab_path}')
    self.vocab = epath.Path(vocab_path).read_text().split('\n')
    if self.vocab[-1] == '':
      self.vocab.pop()
    ids = {token: i for i, token in enumerate(self.vocab)}
    absent = [t for t in SPECIAL_TOKENS if t not in ids]
    if absent:
      raise errors.BadInput(
          f'WordPiece vocab {vocab_path} ({len(self.vocab)} lines) lacks the '
          f'special tokens {absent}.')
    self.vocab_path = vocab_path
    self._lower_case = lower_case
    self._offsets_tokenizer = None
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        ids[t] for t in SPECIAL_TOKENS)
    # Eagerly, even when first built inside a tf.data map: the table must
    # outlive the graph being traced.
    with tf.init_scope():
      table = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(
              tf.constant(self.vocab),
              tf.range(len(self.vocab), dtype=tf.int64)),
          default_value=-1)
      self._tokenizer = tf_text.BertTokenizer(
          table, token_out_type=tf.int64, lower_case=lower_case)

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def tokenize(self, texts) -> tf.RaggedTensor:
    """[batch] strings -> [batch, (wordpieces)] int64 ids."""
    return self._tokenizer.tokenize(texts).merge_dims(-2, -1)

  def tokenize_with_offsets(self, texts: Sequence[str]
                            ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each text's wordpieces and their UTF-8 byte spans in the text itself.

    BertTokenizer's offsets point into its lower-cased, accent-stripped copy
    of the text; FastBertTokenizer (the same WordPiece) tracks the original,
    so a predicted span maps back to the text with its casing and spacing.
    """
    if self._offsets_tokenizer is None:
      with tf.init_scope():
        self._offsets_tokenizer = tf_text.FastBertTokenizer(
            self.vocab, token_out_type=tf.int64,
            lower_case_nfd_strip_accents=self._lower_case)
    ids, starts, ends = self._offsets_tokenizer.tokenize_with_offsets(
        tf.constant(list(texts)))
    return [(i, list(zip(s, e))) for i, s, e in zip(
        ids.to_list(), starts.to_list(), ends.to_list())]

  @property
  def first_regular_id(self) -> int:
    """The first id that is an ordinary wordpiece (not [PAD], [unused0], ...)."""
    return next(i for i, t in enumerate(self.vocab)
                if not (t.startswith('[') and t.endswith(']')))

  def detokenize(self, ids) -> tf.Tensor:
    """[n] ids -> the text they spell, wordpieces merged, special tokens kept."""
    words = self._tokenizer.detokenize(tf.reshape(tf.cast(ids, tf.int64),
                                                  [1, -1]))
    return tf.strings.reduce_join(words[0], separator=' ')

  def join(self, segments: Sequence[tf.RaggedTensor], max_length: int,
           truncation: str = 'waterfall') -> dict[str, tf.Tensor]:
    """`[CLS] s1 [SEP] s2 [SEP] ...`, truncated and padded to `max_length`.

    Args:
      segments: one or more [batch, (n)] ragged id tensors.
      max_length: the length budget, special tokens included.
      truncation: 'waterfall' (cut the last segment first) or 'longest_first'.

    Returns:
      token_ids, token_type_ids (segment index, 0 for [CLS]) and input_mask
      (1 on real tokens), each [batch, max_length] int32.
    """
    budget = max_length - len(segments) - 1
    if budget < 0:
      raise ValueError(f'max_length={max_length} cannot hold the special tokens '
                       f'of {len(segments)} segment(s).')
    if truncation not in _TRIMMERS:
      raise ValueError(f'truncation={truncation!r}; expected one of '
                       f'{sorted(_TRIMMERS)}.')
    trimmed = _TRIMMERS[truncation](budget).trim(list(segments))
    token_ids, token_type_ids = tf_text.combine_segments(
        trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)
    token_ids, input_mask = tf_text.pad_model_inputs(
        token_ids, max_length, pad_value=self.pad_id)
    token_type_ids, _ = tf_text.pad_model_inputs(token_type_ids, max_length)
    return {
        'token_ids': tf.cast(token_ids, tf.int32),
        'token_type_ids': tf.cast(token_type_ids, tf.int32),
        'input_mask': tf.cast(input_mask, tf.int32),
    }

  def numpy_join(self, *texts: Sequence[str], max_length: int,
                 truncation: str = 'waterfall') -> dict[str, np.ndarray]:
    """Eager convenience: lists of strings, one list per segment, to numpy."""
    joined = self.join([self.tokenize(tf.constant(list(t))) for t in texts],
                       max_length, truncation)
    return {k: v.numpy() for k, v in joined.items()}
