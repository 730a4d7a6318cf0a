"""Pre-training queries drawn from span arrays without TensorFlow: the seqio
task's queries, token for token; every span once an epoch; resumed and
split over processes exactly; the held-out blocks apart; the ablations
masked as the seqio task masks them."""

import collections
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from realm_jax import checksums, default_files, errors
from realm_jax.data import (block_store, corpus, example_arrays,
                            masked_queries, masking, salient_spans,
                            span_arrays, task_names)
from realm_jax.input import arrays
from tests.helpers import unchanged

SHAPES = {'query_token_ids': (32,), 'mlm_positions': (8,),
          'mlm_targets': (8,), 'block_id': ()}


def _shapes(length):
  return {**SHAPES, 'query_token_ids': (length,)}


@pytest.fixture(scope='module')
def spans_root(small_corpus, tmp_path_factory, tokenizer):
  """The small corpus's spans of both splits, under an arrays root."""
  root = str(tmp_path_factory.mktemp('arrays'))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(corpus.CORPUS_ROOT_ENV, small_corpus)
    for split in ('train', 'validation'):
      span_arrays.write('wiki_leads', split, tokenizer, root)
  yield from unchanged(root, 'span arrays')


def _spans(root, corpus_root, split, corpus_name='wiki_leads'):
  return span_arrays.SpanArrays(
      span_arrays.directory(corpus_name, split, root),
      block_store.open_store(os.path.join(corpus_root, corpus_name)))


def _draws(root, corpus_root, split, masking_name, tokenizer,
           corpus_name='wiki_leads'):
  return masked_queries.Draws(_spans(root, corpus_root, split, corpus_name),
                              masking_name, tokenizer)


def _annotated(corpus_root, split, corpus_name='wiki_leads'):
  path = os.path.join(corpus_root, corpus_name, salient_spans.ANNOTATED_DIR,
                      f'{split}.tfrecord')
  return tf.data.TFRecordDataset(path).map(
      salient_spans.parse_annotated_block)


def _fixed(queries, shapes):
  """The seqio pipeline's cut and zero-padding of a list of queries."""
  return {name: np.stack([example_arrays.fixed(np.asarray(q[name]), shape)
                          for q in queries]) for name, shape in shapes.items()}


def _seqio_every_span(corpus_root, split, tokenizer, length,
                      corpus_name='wiki_leads'):
  """Every span of the split, masked by the seqio task's TF code."""
  queries = list(_annotated(corpus_root, split, corpus_name).flat_map(
      lambda block: masking.every_salient_span(block, tokenizer, length)
  ).as_numpy_iterator())
  return _fixed(queries, _shapes(length))


def _all(draws, shapes, **kwargs):
  [batch] = masked_queries.batches(draws, shapes, draws.count, shuffle=False,
                                   num_epochs=1, **kwargs)
  return batch


def _keys(batch):
  return [b''.join(batch[name][row].tobytes() for name in sorted(batch))
          for row in range(len(batch['block_id']))]


@pytest.mark.integration
@pytest.mark.parametrize('split', ['train', 'validation'])
@pytest.mark.parametrize('length', [96, 24])
def test_drawn_salient_queries_are_the_seqio_tasks_token_for_token(
    spans_root, small_corpus, tokenizer, split, length):
  """The same span gives the same query, positions and targets as
  `masking.mask_salient_span`; at 24 wordpieces words before the span go."""
  expected = _seqio_every_span(small_corpus, split, tokenizer, length)
  drawn = _all(_draws(spans_root, small_corpus, split, 'salient', tokenizer),
               _shapes(length))
  assert len(drawn['block_id']) == len(expected['block_id']) > 10
  for name in SHAPES:
    np.testing.assert_array_equal(drawn[name], expected[name], err_msg=name)


@pytest.mark.integration
def test_a_span_that_ends_inside_a_word_is_masked_as_the_seqio_task_does(
    tmp_path, tokenizer, monkeypatch):
  """A date inside a word ("1023" of "6.02214076×1023"): the sentence cut
  at its bounds would give other wordpieces than the three parts the seqio
  task tokenizes apart, so the span gets a row of its own."""
  source = tmp_path / 'articles.jsonl'
  source.write_text(json.dumps({
      'title': 'Avogadro constant',
      'text': 'The constant is 6.02214076×1023 per mole. It was named '
              'after Amedeo Avogadro in 1909.'}) + '\n')
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(tmp_path / 'corpora'))
  directory = corpus.corpus_dir('cuts')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[str(source)])
  salient_spans.annotate_corpus(directory, tokenizer, validation_per_mille=0)
  root = str(tmp_path / 'arrays')
  written = span_arrays.write('cuts', 'train', tokenizer, root)
  assert written['cut_rows'] == 1  # The span's own row.
  expected = _seqio_every_span(tmp_path / 'corpora', 'train', tokenizer, 96,
                               'cuts')
  drawn = _all(_draws(root, tmp_path / 'corpora', 'train', 'salient',
                      tokenizer, 'cuts'), _shapes(96))
  targets = [tokenizer.decode(t[t != 0]) for t in drawn['mlm_targets']]
  assert '1023' in targets
  for name in SHAPES:
    np.testing.assert_array_equal(drawn[name], expected[name], err_msg=name)


@pytest.mark.integration
def test_an_epoch_draws_every_span_once_in_an_order_the_seed_fixes(
    spans_root, small_corpus, tokenizer):
  draws = _draws(spans_root, small_corpus, 'train', 'salient', tokenizer)
  every = collections.Counter(_keys(_all(draws, SHAPES)))
  assert len(every) == draws.count  # Each span its own query.
  stream = masked_queries.batches(draws, SHAPES, 7, seed=5)
  drawn = []
  while len(drawn) < 2 * draws.count:
    drawn += _keys(next(stream))
  epochs = drawn[:draws.count], drawn[draws.count:2 * draws.count]
  for epoch in epochs:
    assert collections.Counter(epoch) == every
  assert epochs[0] != epochs[1]  # Each epoch in an order of its own.
  again = masked_queries.batches(draws, SHAPES, 7, seed=5)
  assert _keys(next(again)) == drawn[:7]
  assert _keys(next(masked_queries.batches(draws, SHAPES, 7, seed=6))
               ) != drawn[:7]


@pytest.mark.integration
@pytest.mark.parametrize('name', task_names.MASKINGS)
def test_a_resumed_or_split_stream_draws_the_same_queries(
    spans_root, small_corpus, tokenizer, name):
  """Batches after b skipped are the tail of the whole stream; two
  processes' rows make the same global batches as one."""
  draws = _draws(spans_root, small_corpus, 'train', name, tokenizer)
  read = lambda **kwargs: [_keys(batch) for batch in masked_queries.batches(
      draws, SHAPES, 8, seed=3, num_epochs=3, **kwargs)]
  whole = read()
  assert len(whole) == 3 * draws.count // 8 > 6
  assert read(skip_batches=5) == whole[5:]
  halves = [read(process_index=p, process_count=2) for p in range(2)]
  assert [a + b for a, b in zip(*halves)] == whole


@pytest.mark.integration
@pytest.mark.parametrize('name', ['random_uniform', 'random_span'])
def test_the_ablations_mask_a_random_sentence_as_the_seqio_task(
    spans_root, small_corpus, tokenizer, name):
  """Each query is one of its block's sentences with the masked wordpieces
  as their targets; the share masked is the seqio task's."""
  draws = _draws(spans_root, small_corpus, 'train', name, tokenizer)
  sentences = collections.defaultdict(list)
  for block in _annotated(small_corpus, 'train').as_numpy_iterator():
    for start, end in zip(block['sentence_starts'], block['sentence_ends']):
      sentences[int(block['block_id'])].append(tokenizer.encode(
          [block['body'][start:end].decode()])[0][:30])
  rates, seqio_rates = [], []
  for epoch in range(4):
    batch = next(masked_queries.batches(draws, SHAPES, draws.count, seed=1,
                                        skip_batches=epoch))
    assert sorted(batch['block_id']) == sorted(sentences)  # Each block once.
    for query, positions, targets, block_id in zip(*(
        batch[n] for n in ('query_token_ids', 'mlm_positions', 'mlm_targets',
                           'block_id'))):
      query = query[1:list(query).index(tokenizer.sep_id)]
      masked = positions[targets != 0] - 1
      original = query.copy()
      original[masked] = targets[targets != 0]
      assert list(original) in sentences[int(block_id)]
      if name == 'random_span':
        assert np.all(query[masked] == tokenizer.mask_id)
      rates.append(len(masked) / len(query))
  function = masking.MASKING_FUNCTIONS[name]
  for seed in range(4):
    for i, block in enumerate(_annotated(small_corpus, 'train')):
      out = function(block, tf.constant([seed, i], tf.int64), tokenizer, 32)
      seqio_rates.append(len(out['mlm_positions']) /
                         (len(out['query_token_ids']) - 2))
  assert abs(np.mean(rates) - np.mean(seqio_rates)) < 0.02
  assert 0.12 < np.mean(rates) < 0.18


@pytest.mark.integration
def test_the_same_seed_and_position_draw_the_same_ablation_query(
    spans_root, small_corpus, tokenizer):
  draws = _draws(spans_root, small_corpus, 'train', 'random_uniform',
                 tokenizer)
  draw = lambda position, seed=0: draws.rows(
      np.array([3] * len(position)), np.array(position), seed, SHAPES)
  same = draw([10, 10])
  for name in SHAPES:
    np.testing.assert_array_equal(same[name][0], same[name][1])
  others = [draw([p])['mlm_positions'][0] for p in range(11, 31)]
  others += [draw([10], seed)['mlm_positions'][0] for seed in range(1, 11)]
  assert any(not np.array_equal(o, same['mlm_positions'][0]) for o in others)


@pytest.mark.integration
def test_the_held_out_blocks_are_apart_and_each_of_their_spans_scored_once(
    spans_root, small_corpus_env, tokenizer, monkeypatch):
  blocks = {split: set(_spans(spans_root, small_corpus_env, split).arrays[
      'block_ids'].tolist()) for split in ('train', 'validation')}
  assert blocks['train'] and blocks['validation']
  assert not blocks['train'] & blocks['validation']
  assert all(salient_spans.is_validation(b, 200) for b in blocks['validation'])
  monkeypatch.setenv(example_arrays.ROOT_ENV, spans_root)
  source = arrays.ArraysSource()
  task = task_names.held_out('wiki_leads')
  read = list(source.batches(task, 'validation', SHAPES, 16, shuffle=False,
                             num_epochs=1, drop_remainder=False))
  expected = _seqio_every_span(small_corpus_env, 'validation', tokenizer,
                               32)
  assert source.example_count(task, 'validation', SHAPES) == sum(
      len(b['block_id']) for b in read) == len(expected['block_id'])
  np.testing.assert_array_equal(
      np.concatenate([b['query_token_ids'] for b in read]),
      expected['query_token_ids'])


@pytest.mark.integration
def test_spans_are_written_once_and_their_fingerprint_is_the_data_position(
    spans_root, small_corpus_env, tokenizer, monkeypatch):
  path = span_arrays.directory('wiki_leads', 'train', spans_root)
  before = os.stat(path / 'span_rows.npy').st_mtime_ns
  again = span_arrays.write('wiki_leads', 'train', tokenizer, spans_root)
  assert os.stat(path / 'span_rows.npy').st_mtime_ns == before
  spans = _spans(spans_root, small_corpus_env, 'train')
  assert again == spans.metadata
  assert spans.metadata['fingerprint'] == example_arrays.fingerprint(
      {name: np.load(path / f'{name}.npy') for name in span_arrays.ARRAYS})
  monkeypatch.setenv(example_arrays.ROOT_ENV, spans_root)
  examples = arrays.ArraysSource()
  for name in task_names.MASKINGS:
    assert examples.position(task_names.pretrain('wiki_leads', name), 1) == {
        'source': 'arrays', 'spans_fingerprint': spans.metadata['fingerprint']}


@pytest.mark.integration
@pytest.mark.parametrize('field', ['vocab_fingerprint', 'corpus_fingerprint'])
def test_spans_of_another_vocabulary_or_corpus_are_refused_naming_both(
    spans_root, small_corpus_env, tmp_path, field):
  root = tmp_path / 'arrays'
  copied = span_arrays.directory('wiki_leads', 'train', str(root))
  shutil.copytree(span_arrays.directory('wiki_leads', 'train', spans_root),
                  copied)
  metadata = json.loads((copied / example_arrays.METADATA).read_text())
  (copied / example_arrays.METADATA).write_text(json.dumps(
      {**metadata, field: 'f00'}))
  checksums.write(copied)  # As if written from that vocabulary or corpus.
  with pytest.raises(errors.IndexMismatchError,
                     match=f'{field} f00, but this run reads '
                     f'{metadata[field]}'):
    arrays.draws(task_names.pretrain('wiki_leads', 'salient'), 'train',
                 str(root))


@pytest.mark.unit
def test_a_corpus_without_spans_reads_the_queries_exported_in_its_name(
    tmp_path):
  """The controlled world's queries are written masked (`data.world`)."""
  task = task_names.pretrain('world', 'salient')
  queries = ({'query_token_ids': [2, 4, 3], 'mlm_positions': [1],
              'mlm_targets': [7], 'block_id': i} for i in range(4))
  written = example_arrays.write(
      example_arrays.directory(task, 'train', str(tmp_path)), queries, SHAPES,
      vocab_fingerprint=corpus.vocab_hash(default_files.task_vocab()))
  source = arrays.ArraysSource(str(tmp_path))
  assert arrays.draws(task, 'train', str(tmp_path)) is None
  assert source.position(task, 1) == {
      'source': 'arrays', 'arrays_fingerprint': written['fingerprint']}
  [batch] = source.batches(task, 'train', SHAPES, 4, shuffle=False,
                           num_epochs=1)
  assert list(batch['block_id']) == [0, 1, 2, 3]


@pytest.mark.unit
def test_a_short_query_keeps_the_span_and_drops_words_before_it():
  row = np.arange(10, 30, dtype=np.int32)  # A sentence of 20 wordpieces.
  query, positions, targets = masked_queries.salient_query(row, 12, 15, 8, 1)
  # The span (wordpieces 12-14) ends the 8 kept; 7-11 come before it.
  np.testing.assert_array_equal(query, [17, 18, 19, 20, 21, 1, 1, 1])
  np.testing.assert_array_equal(positions, [5, 6, 7])
  np.testing.assert_array_equal(targets, [22, 23, 24])
  query, positions, targets = masked_queries.salient_query(row, 2, 4, 8, 1)
  np.testing.assert_array_equal(query, [10, 11, 1, 1, 14, 15, 16, 17])
  # A span longer than the query is masked as far as the query reaches.
  query, positions, _ = masked_queries.salient_query(row, 1, 19, 8, 1)
  assert list(query) == [1] * 8 and list(positions) == list(range(8))


@pytest.mark.unit
def test_spans_missing_say_how_to_write_them(tmp_path):
  with pytest.raises(errors.NotFound, match='realm-jax data export'):
    span_arrays.SpanArrays(tmp_path / 'nothing', None)


@pytest.mark.unit
def test_the_task_names_of_pre_training_name_their_corpus_and_masking():
  for name in (*task_names.MASKINGS, task_names.EVERY_SPAN):
    assert task_names.masked_lm(task_names.pretrain('wiki_leads', name)) == (
        'wiki_leads', name)
  assert task_names.masked_lm(task_names.ict('wiki_leads')) is None
  assert task_names.masked_lm(
      task_names.held_out('world') + '_no_document') is None


@pytest.mark.integration
def test_the_arrays_source_opens_a_corpus_once_for_every_read(
    spans_root, small_corpus_env, monkeypatch):
  monkeypatch.setenv(example_arrays.ROOT_ENV, spans_root)
  opened, load = [], corpus.load_metadata
  monkeypatch.setattr(corpus, 'load_metadata',
                      lambda path: opened.append(path) or load(path))
  source = arrays.ArraysSource()
  task = task_names.pretrain('wiki_leads', 'salient')
  position = source.position(task, 1)
  count = source.example_count(task, 'train', SHAPES)
  batch = next(source.batches(task, 'train', SHAPES, 4))
  assert position['spans_fingerprint'] and count > 0
  assert len(batch['block_id']) == 4
  assert len(opened) == 1, opened


@pytest.mark.unit
def test_spans_held_finds_the_masked_span_verbatim_in_each_block():
  blocks = np.array([[[0, 0, 0, 0], [5, 7, 8, 9]],     # 7 8 in block 1
                     [[0, 0, 0, 0], [7, 5, 8, 0]],     # 7 and 8, apart
                     [[0, 0, 0, 0], [1, 2, 3, 4]]])
  targets = np.array([[7, 8, 0], [7, 8, 0], [0, 0, 0]])
  mask = targets != 0
  np.testing.assert_array_equal(
      masked_queries.spans_held(blocks, targets, mask),
      [[False, True], [False, False], [False, False]])


@pytest.mark.unit
def test_a_holding_block_is_drawn_from_the_article_else_the_own_block():
  """Blocks 0-2 are one article, 3-4 another, 5 a third. Query 0 (block 0,
  span 7 8) is held by blocks 1 and 2, drawn alike; query 1 (block 3) by
  no other block of its article (block 5 holds it, in another); query 2's
  article is block 5 alone."""
  articles = np.array([0, 0, 0, 1, 1, 2])
  table = np.array([[7, 8, 0], [1, 7, 8], [7, 8, 9], [7, 8, 0], [7, 0, 8],
                    [7, 8, 1], [0, 0, 0]])  # The last row: no block.
  tokens_of = lambda ids: table[np.where(ids < 0, -1, ids)]
  targets = np.array([[7, 8], [7, 8], [7, 8]])
  drawn = np.array([masked_queries.draw_holders(
      articles, tokens_of, [0, 3, 5], targets, targets != 0,
      np.random.default_rng(seed), none=-1) for seed in range(200)])
  assert set(drawn[:, 0]) == {1, 2} and 60 < np.sum(drawn[:, 0] == 1) < 140
  assert np.all(drawn[:, 1] == 3) and np.all(drawn[:, 2] == 5)
  # With a fallback, the queries that no other block holds read it.
  fallen = masked_queries.draw_holders(
      articles, tokens_of, [0, 3, 5], targets, targets != 0,
      np.random.default_rng(0), none=-1, fallback=np.array([9, 4, -1]))
  assert fallen[0] in (1, 2) and list(fallen[1:]) == [4, -1]
