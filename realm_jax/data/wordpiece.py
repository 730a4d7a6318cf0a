"""BERT's basic tokenization and WordPiece in pure Python.

The ids equal tensorflow-text's `BertTokenizer` (and the byte offsets its
`FastBertTokenizer`), so eager callers need no TensorFlow and a text gets the
same wordpieces in a tf.data pipeline and outside one. What BERT does:

- lower_case: ICU's NFKC_Casefold (NFKC, full case folding, default
  ignorable code points deleted), then NFD with the nonspacing marks (Mn)
  dropped: cased and accented letters meet their plain lower-case forms;
- control (Cc) and format (Cf) characters become spaces;
- words are the runs between spaces; each punctuation mark (ASCII symbols
  included) and each CJK ideograph is a word of its own;
- each word is split greedily into the longest wordpieces in the vocab,
  those after the first prefixed '##'; a word longer than 100 UTF-8 bytes,
  or with a stretch no wordpiece covers, is one [UNK].

Written here because Hugging Face's BertWordPieceTokenizer lower-cases
rather than folding case, and gives other ids for 48 of the demo's 10,054
blocks (final sigma, ellipsis, ß; docs/data.md).

Characters unknown to Python's `unicodedata` (assigned after its Unicode
version, 14.0 in Python 3.11) are taken as unassigned: kept as they are,
inside words. tf-text's ICU (Unicode 16) and RE2 (15) know some of them as
letters to fold, marks to drop or punctuation.
"""

import functools
import itertools
import re
import unicodedata
from typing import Mapping, Sequence

SUFFIX_INDICATOR = '##'
# Longer words are [UNK] whole (tf-text's default max_bytes_per_word).
MAX_BYTES_PER_WORD = 100
# Default_Ignorable_Code_Point (DerivedCoreProperties.txt), which
# NFKC_Casefold deletes.
DEFAULT_IGNORABLE = re.compile(
    '[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f'
    '\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8'
    '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]')
# BERT's CJK ideograph blocks.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
        (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# BertTokenizer splits on RE2's \s; all of it but ' ' is a control character,
# a space by then.
_SPACES = frozenset(' ')
# FastBertTokenizer splits on ICU's White_Space (PropList.txt), which adds
# the ogham space mark and the line and paragraph separators.
_WHITE_SPACE = frozenset(
    '\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006'
    '\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000')
# ASCII control characters as spaces: the lower-case step of ASCII text.
_ASCII_CONTROLS = {c: ' ' for c in [*range(32), 127]}
# Bound on the cached words of each kind: enough for a corpus's vocabulary.
_CACHE_SIZE = 1 << 18


def fold_case(text: str) -> str:
  """ICU's NFKC_Casefold: NFKC, full case folding and the default ignorable
  code points deleted, repeated until nothing changes."""
  folded = unicodedata.normalize('NFKC', text)
  while True:
    again = unicodedata.normalize(
        'NFKC', DEFAULT_IGNORABLE.sub('', folded.casefold()))
    if again == folded:
      return folded
    folded = again


@functools.lru_cache(maxsize=1 << 16)
def _stripped(char: str) -> str:
  """A character after the accents step: nonspacing marks dropped, control
  and format characters spaces."""
  category = unicodedata.category(char)
  if category == 'Mn':
    return ''
  return ' ' if category in ('Cc', 'Cf') else char


def _controls_to_spaces(char: str) -> str:
  return ' ' if unicodedata.category(char) in ('Cc', 'Cf') else char


def normalize(text: str, lower_case: bool = True) -> str:
  """What BertTokenizer makes of `text` before it splits it into words."""
  if text.isascii():
    return (text.lower() if lower_case else text).translate(_ASCII_CONTROLS)
  if lower_case:
    return ''.join(map(_stripped,
                       unicodedata.normalize('NFD', fold_case(text))))
  return ''.join(map(_controls_to_spaces, text))


@functools.lru_cache(maxsize=1 << 16)
def is_punctuation(char: str) -> bool:
  """A word by itself: ASCII punctuation and symbols, Unicode punctuation
  (P*), CJK ideographs."""
  code = ord(char)
  if code < 128:
    return not char.isalnum() and 32 < code < 127
  return (unicodedata.category(char).startswith('P')
          or any(low <= code <= high for low, high in _CJK))


def _words(text: str, spaces: frozenset[str]):
  """(start, end) character spans of the words of normalized `text`."""
  start = 0
  for i, char in enumerate(text):
    if char in spaces:
      if start < i:
        yield start, i
      start = i + 1
    elif is_punctuation(char):
      if start < i:
        yield start, i
      yield i, i + 1
      start = i + 1
  if start < len(text):
    yield start, len(text)


def _utf8_length(char: str) -> int:
  code = ord(char)
  return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


class WordPiece:
  """Texts to wordpiece ids (and byte offsets) over a vocab.

  Results are cached by word and by space-separated chunk of the input:
  normalization never crosses a space, and running text repeats its words.
  """

  def __init__(self, ids: Mapping[str, int], unk_id: int,
               lower_case: bool = True):
    """`ids` maps each wordpiece (continuations with '##') to its id."""
    self._ids = ids
    self._unk_id = unk_id
    self._lower_case = lower_case
    # No wordpiece is longer: longer candidates need no lookup.
    self._max_piece_chars = max(map(len, ids))
    self._word_pieces = functools.lru_cache(_CACHE_SIZE)(self._pieces)
    self._chunk_ids = functools.lru_cache(_CACHE_SIZE)(self._tokenize_chunk)
    self._chunk_spans = functools.lru_cache(_CACHE_SIZE)(
        self._tokenize_chunk_with_offsets)

  def _pieces(self, word: str) -> tuple[tuple[int, int, int], ...]:
    """(id, start, end) of each wordpiece of a word, in characters; one
    [UNK] for a word too long or not covered by the vocab."""
    unknown = ((self._unk_id, 0, len(word)),)
    if len(word.encode('utf-8')) > MAX_BYTES_PER_WORD:
      return unknown
    pieces, start = [], 0
    while start < len(word):
      prefix = SUFFIX_INDICATOR if start else ''
      for end in range(min(len(word), start + self._max_piece_chars),
                       start, -1):
        piece_id = self._ids.get(prefix + word[start:end])
        if piece_id is not None:
          pieces.append((piece_id, start, end))
          start = end
          break
      else:
        return unknown
    return tuple(pieces)

  def _tokenize_chunk(self, chunk: str) -> tuple[int, ...]:
    text = normalize(chunk, self._lower_case)
    return tuple(piece_id for start, end in _words(text, _SPACES)
                 for piece_id, _, _ in self._word_pieces(text[start:end]))

  def tokenize(self, text: str) -> list[int]:
    """BertTokenizer's wordpiece ids of `text`."""
    return list(itertools.chain.from_iterable(
        map(self._chunk_ids, text.split(' '))))

  def _tokenize_chunk_with_offsets(self, chunk: str) -> tuple[
      tuple[int, ...], tuple[tuple[int, int], ...], int]:
    """The ids of a chunk's wordpieces, their spans in its UTF-8 bytes and
    its length in bytes.

    As FastBertTokenizer: each character normalized by itself; a wordpiece
    starts at the character its first normalized character came from and
    ends where the character after its last one came from (the chunk's end
    after the last), so dropped accents and ignorables join the word before
    them.
    """
    if chunk.isascii():  # One byte, and one normalized character, each.
      text, origins = normalize(chunk, self._lower_case), range(len(chunk) + 1)
    else:
      normalized, origins, offset = [], [], 0
      for char in chunk:
        mapped = normalize(char, self._lower_case)
        normalized.append(mapped)
        origins.extend([offset] * len(mapped))
        offset += _utf8_length(char)
      origins.append(offset)
      text = ''.join(normalized)
    pieces = [(piece_id, origins[start + begin], origins[start + end])
              for start, stop in _words(text, _WHITE_SPACE)
              for piece_id, begin, end in self._word_pieces(text[start:stop])]
    return (tuple(p[0] for p in pieces), tuple((p[1], p[2]) for p in pieces),
            origins[-1])

  def tokenize_with_offsets(self, text: str
                            ) -> tuple[list[int], list[tuple[int, int]]]:
    """FastBertTokenizer's wordpiece ids of `text` and the UTF-8 byte span
    of each in `text` itself (not its normalized copy)."""
    ids, placed, base = [], [], 0
    for chunk in text.split(' '):
      chunk_ids, spans, length = self._chunk_spans(chunk)
      if chunk_ids:
        ids.extend(chunk_ids)
        placed.append((base, spans))
      base += length + 1
    return ids, [(at + start, at + end)
                 for at, spans in placed for start, end in spans]


def decode(vocab: Sequence[str], ids) -> str:
  """The text wordpiece `ids` spell: wordpieces joined by spaces, each '##'
  continuation glued to the piece before it, special tokens kept; ids past
  the vocab read as [UNK] (tf-text's `detokenize`)."""
  tokens = []
  for i in ids:
    i = int(i)
    if i < 0:
      raise ValueError(f'Negative wordpiece id {i}.')
    tokens.append(vocab[i] if i < len(vocab) else '[UNK]')
  return ' '.join(tokens).replace(' ' + SUFFIX_INDICATOR, '').strip(' ')
