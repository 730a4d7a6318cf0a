"""The pure-Python WordPiece gives tensorflow-text's ids, offsets, detokenized
text and joins: on hard cases, random text and the embedded Wikipedia leads."""

import sys

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text
from hypothesis import strategies as st

from realm_jax import default_files
from realm_jax.data import sources, wordpiece
from realm_jax.data.tokenization import WordPieceTokenizer

pytestmark = pytest.mark.unit

HARD_CASES = [
    '', ' ', '   ', '\t\n\r\f\v', 'hello world', '  padded  text  ',
    'Hello, World!', "they're", 'unaffable', 'a--b...c?!', '[CLS] [UNK] ##ing',
    '$100 €200 £300 ¥ 5%', 'x^2 + y_1 = z|w~`@', '«quoted» „low“ ‘single’',
    'naïve café RÉSUMÉ', 'Ångström Øresund Æsir', 'Tiếng Việt', 'Ελληνικά ΣΊΣΥΦΟΣ',
    'Straße STRASSE ẞ', 'İstanbul ıi İ̇', 'ǅemal ŉ և', 'ﬁnancial ﬂow ﬅ',
    'ＦＵＬＬＷＩＤＴＨ ａｂｃ１２３！', '½ ² ℌ ℡ ㎒ Ⅻ ⑳', '𝐁𝐨𝐥𝐝 𝔉𝔯𝔞𝔨𝔱𝔲𝔯',
    '中文字符测试', '日本語のテキスト、カタカナ', '한국어 텍스트', 'ᄀ\u1161 가',
    '\U00020000\U0002a700 \uf900', 'हिन्दी', 'ภาษาไทย', 'مُحَمَّد العربية',
    'שָׁלוֹם', 'emoji 😀👍🏽 👨\u200d👩\u200d👧 🇫🇷',
    'zero\u200bwidth\u200djoiner\u200cnon\u2060word', 'soft\u00adhyphen',
    '\ufeffbom \u202eright\u202c \u200fmark', 'tag\U000e0041\U000e007f',
    'variation\ufe0f \u180bmongolian \u3164filler \uffa0',
    'e\u0301 a\u0308\u0323 o\u0327\u0301 \u0301leading',
    'combining\u0345 \u1fb3 Ϊ́', 'reorder a\U0001d16d\U0001d165b',
    'control\x00chars\x01\x1f\x7f\x85\x9f', 'nbsp\u00a0thin\u2009ideo\u3000narrow\u202f',
    'ogham\u1680space line\u2028sep para\u2029sep', 'ﷺ ﷻ',
    'ᏣᎳᎩ ꮳꮃꭹ', 'Ⓐⓑ ⒜', 'a' * 100, 'a' * 101, 'é' * 51, 'α' * 50, 'α' * 51, 'ǆ' * 50,
    'x' * 99 + '.', 'y' * 150 + '.z', 'word' * 30 + ' end', '😀' * 25,
    '\U0010ffff\ufdd0\ufffe noncharacters', '\U000f0000 private \ue000',
]


@pytest.fixture(scope='module')
def fast_bert(tokenizer):
  """tf-text's FastBertTokenizer, whose offsets `tokenize_with_offsets`
  reproduces."""
  return tf_text.FastBertTokenizer(
      tokenizer.vocab, token_out_type=tf.int64,
      lower_case_nfd_strip_accents=True)


def _tf_offsets(fast_bert, texts):
  ids, starts, ends = fast_bert.tokenize_with_offsets(tf.constant(texts))
  return [(i, list(zip(s, e))) for i, s, e in zip(
      ids.to_list(), starts.to_list(), ends.to_list())]


def _assert_same_as_tf(tokenizer, fast_bert, texts):
  texts = list(texts)
  assert tokenizer.encode(texts) == tokenizer.tokenize(texts).to_list()
  assert tokenizer.tokenize_with_offsets(texts) == _tf_offsets(fast_bert,
                                                                texts)


@pytest.mark.parametrize('text', HARD_CASES, ids=ascii)
def test_hard_cases_equal_tf_text(tokenizer, fast_bert, text):
  _assert_same_as_tf(tokenizer, fast_bert, [text])
  ids = tokenizer.encode([text])[0]
  assert tokenizer.decode(ids) == tokenizer.detokenize(ids).numpy().decode()


def test_cased_hard_cases_equal_tf_text(tokenizer):
  cased = WordPieceTokenizer(tokenizer.vocab_path, lower_case=False)
  fast = tf_text.FastBertTokenizer(cased.vocab, token_out_type=tf.int64,
                                   lower_case_nfd_strip_accents=False)
  _assert_same_as_tf(cased, fast, HARD_CASES)


def test_separators_differ_between_the_two_tf_tokenizers(tokenizer):
  """BertTokenizer splits on ASCII spaces only, FastBertTokenizer on all of
  Unicode's White_Space: each API follows its own."""
  text = 'a\u2028b'
  assert len(tokenizer.encode([text])[0]) == 1
  assert len(tokenizer.tokenize_with_offsets([text])[0][0]) == 2


# Any character Python's Unicode database knows (tf-text's is newer), mixed
# with ones that take part in casing, accents, splitting and ignoring.
_CHARS = st.one_of(
    st.characters(exclude_categories=('Cs', 'Cn')),
    st.sampled_from(list('aeiAE #.,-') + [
        '\u0301', '\u0308', 'ß', 'İ', 'ﬁ', '中', '\u200d', '\u00ad', '\x00',
        '\u2028', '\u3000', '\U0001d165', '\U0001d16d', 'é', 'Σ', '😀']))


@hypothesis.settings(max_examples=40, derandomize=True, deadline=None)
@hypothesis.given(texts=st.lists(st.text(_CHARS, max_size=40), min_size=1,
                                 max_size=16))
def test_random_text_equals_tf_text(tokenizer, fast_bert, texts):
  _assert_same_as_tf(tokenizer, fast_bert, texts)


@hypothesis.settings(max_examples=40, derandomize=True, deadline=None)
@hypothesis.given(ids=st.lists(st.integers(0, 31_000), max_size=40))
def test_decode_equals_detokenize(tokenizer, ids):
  assert tokenizer.decode(ids) == tokenizer.detokenize(ids).numpy().decode()


def test_wikipedia_leads_equal_tf_text(tokenizer, fast_bert):
  articles = list(sources.read_wiki_leads(default_files.wiki_leads_json()))[:2000]
  texts = [a.text for a in articles] + [a.title for a in articles]
  # One assert per list: a mismatch names its text without printing all.
  expected = tokenizer.tokenize(texts).to_list()
  encoded = tokenizer.encode(texts)
  assert [t for t, a, b in zip(texts, encoded, expected) if a != b] == []
  expected = _tf_offsets(fast_bert, texts)
  with_offsets = tokenizer.tokenize_with_offsets(texts)
  assert [t for t, a, b in zip(texts, with_offsets, expected) if a != b] == []


def _tf_join(tokenizer, texts, max_length, truncation):
  joined = tokenizer.join([tokenizer.tokenize(tf.constant(t)) for t in texts],
                          max_length, truncation)
  return {k: v.numpy() for k, v in joined.items()}


def _assert_joins_equal(tokenizer, texts, max_length, truncation):
  expected = _tf_join(tokenizer, texts, max_length, truncation)
  joined = tokenizer.numpy_join(*texts, max_length=max_length,
                                truncation=truncation)
  assert joined.keys() == expected.keys()
  for key, value in expected.items():
    assert joined[key].dtype == np.int32
    np.testing.assert_array_equal(joined[key], value, err_msg=key)


@pytest.mark.parametrize('truncation', ['waterfall', 'longest_first'])
def test_join_of_segments_of_3_4_4_tokens_in_a_budget_of_7(tokenizer,
                                                           truncation):
  # The example of tf-text's ShrinkLongestTrimmer: it keeps [2, 2, 3].
  texts = [['a b c'], ['d e f g'], ['h i j k']]
  _assert_joins_equal(tokenizer, texts, 7 + 4, truncation)


# Segments of one-wordpiece words, so that lengths often tie.
_SEGMENT = st.lists(st.sampled_from(['a', 'b', 'hello', 'world', '.']),
                    max_size=9).map(' '.join)


@hypothesis.settings(max_examples=30, derandomize=True, deadline=None)
@hypothesis.given(
    data=st.data(), num_segments=st.integers(1, 3), rows=st.integers(1, 30),
    truncation=st.sampled_from(['waterfall', 'longest_first']))
def test_numpy_join_equals_tf_join(tokenizer, data, num_segments, rows,
                                   truncation):
  texts = [data.draw(st.lists(_SEGMENT, min_size=rows, max_size=rows))
           for _ in range(num_segments)]
  max_length = data.draw(st.integers(num_segments + 1, 24))
  _assert_joins_equal(tokenizer, texts, max_length, truncation)


def test_a_word_over_100_bytes_is_one_unknown(tokenizer):
  # 'α' is two UTF-8 bytes (and a wordpiece): 50 are a word, 51 too long.
  assert tokenizer.unk_id not in tokenizer.encode(['α' * 50])[0]
  ids, spans = tokenizer.tokenize_with_offsets(['ok ' + 'α' * 51 + '!'])[0]
  assert ids[1:] == [tokenizer.unk_id, tokenizer.encode(['!'])[0][0]]
  assert spans[1:] == [(3, 3 + 102), (105, 106)]


def test_offsets_point_into_the_original_text(tokenizer):
  text = 'Ｃａｆé  ﬁx'
  ids, spans = tokenizer.tokenize_with_offsets([text])[0]
  raw = text.encode('utf-8')
  assert [raw[s:e].decode() for s, e in spans] == ['Ｃａｆé', 'ﬁx']
  assert ids == tokenizer.encode(['cafe fix'])[0]


def test_fold_case_is_nfkc_casefold():
  assert wordpiece.fold_case('Straße ﬁ Ω K \u00ad\u200b') == 'strasse fi ω k '


def test_eager_api_needs_no_tensorflow(tokenizer, monkeypatch):
  for name in ('tensorflow', 'tensorflow_text'):
    monkeypatch.setitem(sys.modules, name, None)  # Imports now fail.
  eager = WordPieceTokenizer(tokenizer.vocab_path)
  ids = eager.encode(['Hello world'])[0]
  assert eager.decode(ids) == 'hello world'
  assert eager.tokenize_with_offsets(['Hello world'])[0][0] == ids
  assert eager.numpy_join(['Hello'], ['world'], max_length=6)['token_ids'][
      0].tolist() == [eager.cls_id, ids[0], eager.sep_id, ids[1],
                      eager.sep_id, eager.pad_id]
