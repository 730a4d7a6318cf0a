"""WordPiece tokenization and the input joins of the REALM paper.

Queries are `[CLS] x [SEP]`, documents `[CLS] title [SEP] body [SEP]` and reader
inputs `[CLS] x [SEP] z_body [SEP]`. Two implementations give the same ids:
TensorFlow ops (tensorflow-text, `tokenize` and `join`) for seqio/tf.data
pipelines, and pure Python (`wordpiece`, `encode`, `numpy_join`, ...) for eager
callers such as the CLI, which then need no TensorFlow. TensorFlow is imported
only when a TF method is first called.
"""

import os
from typing import Sequence

import numpy as np
from etils import epath

from realm_jax import errors
from realm_jax.data import wordpiece

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
# tensorflow-text's trimmer for each truncation.
_TRIMMERS = {
    # Drops the tail of the last segment first: the body of a block, never the
    # query in front of it.
    'waterfall': 'WaterfallTrimmer',
    # BERT's longest-first truncation.
    'longest_first': 'ShrinkLongestTrimmer',
}


def _waterfall(lengths: list[int], budget: int) -> list[int]:
  """Each segment keeps what the segments before it left of the budget."""
  kept = []
  for length in lengths:
    kept.append(min(length, max(budget, 0)))
    budget -= length
  return kept


def _shrink_longest(lengths: list[int], budget: int) -> list[int]:
  """tf-text's ShrinkLongestTrimmer: while over budget, the longest segment
  (the first of equals) loses its last token.

  In closed form: segments are capped at the largest `cap` within budget,
  and what the budget has left goes back, a token each, to the last of the
  segments longer than `cap` (the first ones lost their token first).
  """
  kept_at = lambda cap: sum(min(n, cap) for n in lengths)
  if kept_at(max(lengths, default=0)) <= budget:
    return list(lengths)
  cap, over = 0, max(lengths)  # kept_at(cap) <= budget < kept_at(over)
  while over - cap > 1:
    middle = (cap + over) // 2
    cap, over = (middle, over) if kept_at(middle) <= budget else (cap, middle)
  kept = [min(n, cap) for n in lengths]
  longer = [i for i, n in enumerate(lengths) if n > cap]
  for i in longer[len(longer) - (budget - sum(kept)):]:
    kept[i] += 1
  return kept


_ALLOCATIONS = {'waterfall': _waterfall, 'longest_first': _shrink_longest}


class WordPieceTokenizer:
  """Uncased (by default) BERT WordPiece over a `vocab.txt`, one token a line."""

  def __init__(self, vocab_path, lower_case: bool = True):
    vocab_path = os.fspath(vocab_path)
    if not epath.Path(vocab_path).is_file():
      raise errors.NotFound(f'WordPiece vocab file not found: {vocab_path}')
    try:
      self.vocab = epath.Path(vocab_path).read_text().split('\n')
    except UnicodeDecodeError as error:
      raise errors.BadInput(
          f'WordPiece vocab {vocab_path} is not UTF-8 text (byte '
          f'{error.start:,}): expected a vocab.txt, one wordpiece a line.'
      ) from None
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
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        ids[t] for t in SPECIAL_TOKENS)
    self._wordpiece = wordpiece.WordPiece(ids, self.unk_id, lower_case)
    self._tf_tokenizer = None

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def _bert_tokenizer(self):
    """tf-text's BertTokenizer over the vocab, built on first use."""
    if self._tf_tokenizer is None:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
      # Eagerly, even when first built inside a tf.data map: the table must
      # outlive the graph being traced.
      with tf.init_scope():
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.vocab),
                tf.range(len(self.vocab), dtype=tf.int64)),
            default_value=-1)
        self._tf_tokenizer = tf_text.BertTokenizer(
            table, token_out_type=tf.int64, lower_case=self._lower_case)
    return self._tf_tokenizer

  def tokenize(self, texts) -> 'tf.RaggedTensor':
    """[batch] strings -> [batch, (wordpieces)] int64 ids, in TF ops."""
    return self._bert_tokenizer().tokenize(texts).merge_dims(-2, -1)

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    """Each text's wordpiece ids, as `tokenize` gives them, without TF."""
    return [self._wordpiece.tokenize(text) for text in texts]

  def tokenize_with_offsets(self, texts: Sequence[str]
                            ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each text's wordpieces and their UTF-8 byte spans in the text itself.

    The spans point into the original text, not its lower-cased,
    accent-stripped copy (as tf-text's FastBertTokenizer), so a predicted span
    maps back to the text with its casing and spacing.
    """
    return [self._wordpiece.tokenize_with_offsets(text) for text in texts]

  @property
  def first_regular_id(self) -> int:
    """The first id that is an ordinary wordpiece (not [PAD], [unused0], ...)."""
    return next(i for i, t in enumerate(self.vocab)
                if not (t.startswith('[') and t.endswith(']')))

  def detokenize(self, ids) -> 'tf.Tensor':
    """[n] ids -> the text they spell, in TF ops (`decode` without TF)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    words = self._bert_tokenizer().detokenize(
        tf.reshape(tf.cast(ids, tf.int64), [1, -1]))
    return tf.strings.reduce_join(words[0], separator=' ')

  def decode(self, ids) -> str:
    """The text `ids` spell, wordpieces merged, special tokens kept (what
    `detokenize` gives, without TF)."""
    return wordpiece.decode(self.vocab, ids)

  def join(self, segments: Sequence['tf.RaggedTensor'], max_length: int,
           truncation: str = 'waterfall') -> dict[str, 'tf.Tensor']:
    """`[CLS] s1 [SEP] s2 [SEP] ...`, truncated and padded to `max_length`.

    Args:
      segments: one or more [batch, (n)] ragged id tensors.
      max_length: the length budget, special tokens included.
      truncation: 'waterfall' (cut the last segment first) or 'longest_first'.

    Returns:
      token_ids, token_type_ids (segment index, 0 for [CLS]) and input_mask
      (1 on real tokens), each [batch, max_length] int32.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
    budget = self._budget(len(segments), max_length, truncation)
    trimmer = getattr(tf_text, _TRIMMERS[truncation])(budget)
    token_ids, token_type_ids = tf_text.combine_segments(
        trimmer.trim(list(segments)), start_of_sequence_id=self.cls_id,
        end_of_segment_id=self.sep_id)
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
    """`join` for lists of strings, one list per segment, in numpy."""
    budget = self._budget(len(texts), max_length, truncation)
    allocate = _ALLOCATIONS[truncation]
    rows = len(texts[0])
    token_ids = np.full((rows, max_length), self.pad_id, np.int32)
    token_type_ids = np.zeros((rows, max_length), np.int32)
    input_mask = np.zeros((rows, max_length), np.int32)
    segments = [self.encode(t) for t in texts]
    for row, pieces in enumerate(zip(*segments, strict=True)):
      kept = allocate([len(p) for p in pieces], budget)
      ids, types = [self.cls_id], [0]
      for segment, (segment_ids, n) in enumerate(zip(pieces, kept)):
        ids += segment_ids[:n] + [self.sep_id]
        types += [segment] * (n + 1)
      token_ids[row, :len(ids)] = ids
      token_type_ids[row, :len(types)] = types
      input_mask[row, :len(ids)] = 1
    return {'token_ids': token_ids, 'token_type_ids': token_type_ids,
            'input_mask': input_mask}

  @staticmethod
  def _budget(num_segments: int, max_length: int, truncation: str) -> int:
    """Wordpieces `max_length` leaves the segments after their [CLS]/[SEP]."""
    budget = max_length - num_segments - 1
    if budget < 0:
      raise ValueError(f'max_length={max_length} cannot hold the special tokens '
                       f'of {num_segments} segment(s).')
    if truncation not in _TRIMMERS:
      raise ValueError(f'truncation={truncation!r}; expected one of '
                       f'{sorted(_TRIMMERS)}.')
    return budget
