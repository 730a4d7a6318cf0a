"""Hugging Face's tokenizer.json for our WordPiece (`data.wordpiece`).

Hugging Face's BertTokenizer lower-cases where ours (tensorflow-text's)
folds case with ICU's NFKC_Casefold, and drops every combining mark where
ours drops the nonspacing ones: on the demo's corpus 48 of 10,054 blocks
get other ids from a plain `vocab.txt` (final sigma, ß, ellipsis). The
`tokenizers` pipeline written here does what ours does, step for step, so
an exported tower reads a text as the run did:

  NFKC; each character whose case folding is not its lower case replaced
  by its folding (ß -> ss, ς -> σ, ...); lower case; the default ignorable
  code points deleted; NFKC; NFD; nonspacing marks (Mn) deleted; control
  and format characters (Cc, Cf) made spaces; then BERT's spaces around
  CJK ideographs, its split on spaces and punctuation, and WordPiece.
"""

import functools
import sys
import unicodedata

from etils import epath

from realm_jax.data import wordpiece

SPECIAL = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')


@functools.cache
def _folded_apart() -> list[tuple[str, str]]:
  """(character, its case folding) where folding and lower case differ."""
  out = []
  for code in range(sys.maxunicode + 1):
    char = chr(code)
    if unicodedata.category(char) not in ('Cs', 'Cn') and (
        char.casefold() != char.lower()):
      out.append((char, char.casefold()))
  return out


def _replace(pattern: dict, content: str) -> dict:
  return {'type': 'Replace', 'pattern': pattern, 'content': content}


def normalizer() -> dict:
  """The normalizer steps of the module docstring."""
  steps = [{'type': 'NFKC'}]
  steps += [_replace({'String': char}, folded)
            for char, folded in _folded_apart()]
  steps += [{'type': 'Lowercase'},
            _replace({'Regex': wordpiece.DEFAULT_IGNORABLE.pattern}, ''),
            {'type': 'NFKC'}, {'type': 'NFD'},
            _replace({'Regex': r'\p{Mn}'}, ''),
            _replace({'Regex': r'[\p{Cc}\p{Cf}]'}, ' '),
            {'type': 'BertNormalizer', 'clean_text': False,
             'handle_chinese_chars': True, 'strip_accents': False,
             'lowercase': False}]
  return {'type': 'Sequence', 'normalizers': steps}


def tokenizer_json(vocab_path: str) -> dict:
  """tokenizer.json of the vocabulary at `vocab_path`."""
  lines = epath.Path(vocab_path).read_text(encoding='utf-8').split('\n')
  vocab = {token: i for i, token in enumerate(
      lines[:-1] if lines[-1] == '' else lines)}
  special = {token: vocab[token] for token in SPECIAL}
  piece = lambda token, type_id: {'SpecialToken': {'id': token,
                                                   'type_id': type_id}}
  sequence = lambda name, type_id: {'Sequence': {'id': name,
                                                 'type_id': type_id}}
  return {
      'version': '1.0', 'truncation': None, 'padding': None,
      'added_tokens': [{'id': i, 'content': token, 'single_word': False,
                        'lstrip': False, 'rstrip': False, 'normalized': False,
                        'special': True} for token, i in special.items()],
      'normalizer': normalizer(),
      'pre_tokenizer': {'type': 'BertPreTokenizer'},
      'post_processor': {
          'type': 'TemplateProcessing',
          'single': [piece('[CLS]', 0), sequence('A', 0), piece('[SEP]', 0)],
          'pair': [piece('[CLS]', 0), sequence('A', 0), piece('[SEP]', 0),
                   sequence('B', 1), piece('[SEP]', 1)],
          'special_tokens': {token: {'id': token, 'ids': [special[token]],
                                     'tokens': [token]}
                             for token in ('[CLS]', '[SEP]')}},
      'decoder': {'type': 'WordPiece', 'prefix': '##', 'cleanup': True},
      'model': {'type': 'WordPiece', 'unk_token': '[UNK]',
                'continuing_subword_prefix': '##',
                'max_input_chars_per_word': wordpiece.MAX_BYTES_PER_WORD,
                'vocab': vocab}}
