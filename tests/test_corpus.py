"""The corpus builder: packing, skipping, determinism, records."""

import json
import os

import numpy as np
import pytest

from realm_jax.data import corpus
from realm_jax.data.skips import SkipReport


@pytest.mark.unit
@pytest.mark.parametrize('seed', range(5))
def test_packing_fills_greedily_and_keeps_order(seed):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 60, 40).tolist()
  groups = corpus.pack_sentences(lengths, budget=100)
  assert sum(groups, []) == list(range(40))
  for i, group in enumerate(groups):
    assert sum(lengths[j] for j in group) <= 100
    if i + 1 < len(groups):  # The next sentence did not fit.
      assert sum(lengths[j] for j in group) + lengths[groups[i + 1][0]] > 100


def _build(tmp_path, tokenizer, rows, name='corpus', **kwargs):
  source = tmp_path / f'{name}.jsonl'
  with open(source, 'wb') as f:
    for row in rows:
      f.write(row if isinstance(row, bytes) else json.dumps(row).encode())
      f.write(b'\n')
  out = str(tmp_path / name)
  return out, corpus.build_corpus(out, tokenizer, jsonl_paths=[str(source)],
                                  **kwargs)


def _blocks(directory):
  return [{k: (v.numpy().tolist() if v.dtype != 'string' else
               v.numpy().decode()) for k, v in b.items()}
          for b in corpus.read_blocks(directory)]


@pytest.mark.unit
def test_blocks_hold_whole_sentences_within_the_budget(tmp_path, tokenizer):
  sentence = 'The quick brown fox jumps over the lazy dog near the river bank.'
  long_sentence = ' '.join(['antidisestablishmentarianism'] * 60) + '.'
  rows = [{'title': 'Foxes', 'text': ' '.join([sentence] * 40)},
          {'title': 'Long', 'text': f'{sentence} {long_sentence} {sentence}'}]
  out, meta = _build(tmp_path, tokenizer, rows, max_block_length=64,
                     max_title_length=16)
  blocks = _blocks(out)
  assert meta['num_blocks'] == len(blocks) and [b['block_id'] for b in blocks
                                                ] == list(range(len(blocks)))
  for block in blocks:
    assert len(block['token_ids']) <= 64
    # Token ids are exactly the tokenizer's `[CLS] title [SEP] body [SEP]`.
    joined = tokenizer.numpy_join([block['title']], [block['body']],
                                  max_length=64)
    assert block['token_ids'] == joined['token_ids'][0][
        joined['input_mask'][0] == 1].tolist()
    body = block['body'].encode()
    sentences = [body[s:e].decode() for s, e in zip(block['sentence_starts'],
                                                    block['sentence_ends'])]
    assert ' '.join(sentences) == block['body']
  fox_blocks = [b for b in blocks if b['title'] == 'Foxes']
  assert all(b['body'].endswith('bank.') for b in fox_blocks)  # Never split.
  assert meta['skipped'] == {
      'sentence longer than a block, cut between words': 1}


@pytest.mark.unit
def test_an_article_becomes_blocks_of_the_runs_length_title_in_each(
    tmp_path, tokenizer):
  """Cut at a run's 64 wordpieces (the title budget a quarter of that):
  every block is whole, carries its article's title, and together they
  hold all of its text, in order; metadata counts blocks per article."""
  sentences = [f'Sentence {i} of the lead names the river Nile and the '
               f'city of Cairo in Egypt.' for i in range(9)]
  rows = [{'title': 'Nile', 'text': ' '.join(sentences)},
          {'title': 'Short', 'text': 'One sentence alone.'}]
  out, meta = _build(tmp_path, tokenizer, rows, max_block_length=64)
  assert meta['max_title_length'] == corpus.title_budget(64) == 16
  assert corpus.title_budget(288) == corpus.MAX_TITLE_LENGTH
  blocks = _blocks(out)
  nile = [b for b in blocks if b['title'] == 'Nile']
  assert len(nile) > 1 and all(len(b['token_ids']) <= 64 for b in blocks)
  assert ' '.join(b['body'] for b in nile) == rows[0]['text']
  title_ids = tokenizer.numpy_join(['Nile'], [''], max_length=8)
  for block in nile:  # [CLS] Nile [SEP] ...
    assert block['token_ids'][:block['title_length'] + 2] == title_ids[
        'token_ids'][0][:block['title_length'] + 2].tolist()
  assert meta['blocks_per_article'] == {'1': 1, str(len(nile)): 1}
  assert meta['skipped'] == {}


@pytest.mark.unit
def test_bad_articles_are_counted(tmp_path, tokenizer):
  rows = [{'title': 'Good', 'text': 'Paris is the capital of France.'},
          {'title': 'List of rivers', 'text': 'The Nile. The Amazon.'},
          {'title': 'Mercury (disambiguation)', 'text': 'Mercury may be:'},
          {'title': 'Mercury', 'text': 'Mercury may refer to:'},
          {'title': 'Empty', 'text': '   '},
          {'title': 'No text'},
          b'{"title": "Broken", "text": ',
          b'{"title": "Bytes", "text": "caf\xe9"}',
          {'title': 'word ' * 80, 'text': 'A very long title indeed.'}]
  out, meta = _build(tmp_path, tokenizer, rows)
  assert [b['title'] for b in _blocks(out)] == ['Good', ('word ' * 80).strip()]
  assert meta['skipped'] == {
      'disambiguation page': 2, 'empty article': 1, 'invalid JSON': 1,
      'list, index or outline page': 1, 'missing title or text field': 1,
      'not UTF-8': 1, 'title over 64 wordpieces, cut': 1}


@pytest.mark.unit
def test_the_same_input_gives_the_same_ids_and_fingerprint(tmp_path,
                                                           tokenizer):
  rows = [{'title': f'T{i}', 'text': f'Sentence {i}. Another one {i}.'}
          for i in range(30)]
  out_a, meta_a = _build(tmp_path, tokenizer, rows, 'a', blocks_per_shard=7)
  out_b, meta_b = _build(tmp_path, tokenizer, rows, 'b', blocks_per_shard=7)
  assert meta_a['corpus_fingerprint'] == meta_b['corpus_fingerprint']
  assert meta_a['source_fingerprint'] == meta_b['source_fingerprint']
  assert _blocks(out_a) == _blocks(out_b)
  assert [s['num_blocks'] for s in meta_a['shards']] == [7, 7, 7, 7, 2]
  rows[3]['text'] = 'Changed.'
  _, meta_c = _build(tmp_path, tokenizer, rows, 'c')
  assert meta_c['corpus_fingerprint'] != meta_a['corpus_fingerprint']


@pytest.mark.unit
def test_a_failed_build_leaves_the_previous_corpus(tmp_path, tokenizer,
                                                   monkeypatch):
  rows = [{'title': 'A', 'text': 'First.'}]
  out, meta = _build(tmp_path, tokenizer, rows)

  def crash(self, articles):
    raise RuntimeError('killed')

  monkeypatch.setattr(corpus.CorpusBuilder, 'blocks', crash)
  with pytest.raises(RuntimeError):
    _build(tmp_path, tokenizer, rows * 3)
  assert corpus.load_metadata(out) == meta
  assert len(_blocks(out)) == 1


@pytest.mark.unit
def test_missing_corpus_says_how_to_build(tmp_path):
  with pytest.raises(FileNotFoundError, match='build-corpus'):
    corpus.load_metadata(str(tmp_path))


@pytest.mark.unit
def test_skip_report_summary():
  report = SkipReport('job')
  assert not report and report.summary() == 'job: nothing skipped.'
  for i in range(5):
    report.add('bad', f'line {i}')
  assert report.summary() == ('job: 5 skipped or repaired:\n'
                              '  bad: 5 (e.g. line 0, line 1, line 2)')


@pytest.mark.integration
def test_small_corpus_metadata(small_corpus):
  meta = corpus.load_metadata(os.path.join(small_corpus, 'wiki_leads'))
  assert meta['num_articles'] == 60 and meta['num_blocks'] >= 60
  assert sum(meta['length_histogram'].values()) == meta['num_blocks']
  assert len(meta['shards']) == -(-meta['num_blocks'] // 25)
