"""A seqio Vocabulary over BERT WordPiece, so tasks can declare and decode."""

import seqio
import tensorflow as tf

from realm_jax.data.tokenization import WordPieceTokenizer


class WordPieceVocabulary(seqio.Vocabulary):
  """BERT's uncased WordPiece. BERT has no EOS: features set add_eos=False."""

  def __init__(self, vocab_path: str, lower_case: bool = True):
    self.vocab_path = vocab_path
    self._lower_case = lower_case
    self._tokenizer = None
    super().__init__(extra_ids=0)

  @property
  def tokenizer(self) -> WordPieceTokenizer:
    # Built on first use: registering tasks at import stays cheap.
    if self._tokenizer is None:
      self._tokenizer = WordPieceTokenizer(self.vocab_path, self._lower_case)
    return self._tokenizer

  @property
  def eos_id(self):
    return None

  @property
  def unk_id(self) -> int:
    return self.tokenizer.unk_id

  @property
  def _base_vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  def _encode(self, s: str):
    return self.tokenizer.tokenize(tf.constant([s])).to_list()[0]

  def _decode(self, ids):
    # Padding decodes to nothing, as in seqio's own vocabularies: predictions
    # (a t5x model's) arrive padded to a fixed width.
    ids = [i for i in ids if i != self.tokenizer.pad_id]
    return self._decode_tf(tf.constant(ids, tf.int64)).numpy().decode('utf-8')

  def _encode_tf(self, s):
    return self.tokenizer.tokenize(tf.reshape(s, [1]))[0]

  def _decode_tf(self, ids):
    return self.tokenizer.detokenize(ids)

  def __eq__(self, other) -> bool:
    return (isinstance(other, WordPieceVocabulary)
            and other.vocab_path == self.vocab_path
            and other._lower_case == self._lower_case)  # pylint: disable=protected-access

  def __hash__(self) -> int:
    return hash((self.vocab_path, self._lower_case))
