"""Pre-tokenized arrays: the seqio tasks' own examples, in a seeded order,
resumed exactly, refused when made from another corpus or vocabulary."""

import json

import numpy as np
import pytest

from realm_jax import checksums, errors
from realm_jax.data import example_arrays, task_names
from realm_jax.input.arrays import ArraysSource
from realm_jax.input.seqio_source import SeqioSource
from tests.helpers import flip_a_bit

ICT_SHAPES = {'query_token_ids': (32,), 'block_token_ids': (64,),
              'block_token_type_ids': (64,)}
MLM_SHAPES = {'query_token_ids': (32,), 'mlm_positions': (8,),
              'mlm_targets': (8,), 'block_id': ()}


def _written(tmp_path, count=10):
  examples = ({'x': np.arange(i, i + 3), 'y': i} for i in range(count))
  example_arrays.write(tmp_path / 't' / 'train', examples,
                       {'x': (4,), 'y': ()}, vocab_fingerprint='v')
  return example_arrays.ExampleArrays(tmp_path / 't' / 'train')


def _ids(batches):
  return [list(batch['y']) for batch in batches]


@pytest.mark.unit
def test_written_arrays_are_cut_and_padded_to_their_shapes(tmp_path):
  arrays = _written(tmp_path)
  assert arrays.count == 10
  np.testing.assert_array_equal(arrays.arrays['x'][2], [2, 3, 4, 0])
  assert arrays.metadata['shapes'] == {'x': [4], 'y': []}


@pytest.mark.unit
def test_the_order_is_a_permutation_each_epoch_fixed_by_the_seed(tmp_path):
  arrays = _written(tmp_path)
  stream = example_arrays.order(10, seed=3, shuffle=True, start=0, stop=30)
  for epoch in range(3):
    assert sorted(stream[epoch * 10:(epoch + 1) * 10]) == list(range(10))
  assert list(stream[:10]) != list(stream[10:20])  # Reshuffled each epoch.
  np.testing.assert_array_equal(
      stream, example_arrays.order(10, 3, True, 0, 30))
  assert list(example_arrays.order(10, 4, True, 0, 10)) != list(stream[:10])
  assert _ids(example_arrays.batches(arrays, {'y': ()}, 5, seed=3,
                                     num_epochs=1)) == [
      list(stream[:5]), list(stream[5:10])]


@pytest.mark.unit
def test_a_resumed_reader_goes_on_where_it_stopped(tmp_path):
  arrays = _written(tmp_path)
  read = lambda skip: _ids(example_arrays.batches(
      arrays, {'y': ()}, 4, seed=1, num_epochs=3, skip_batches=skip))
  whole = read(0)
  assert len(whole) == 7  # 30 examples, the last 2 dropped.
  assert read(3) == whole[3:]


@pytest.mark.unit
def test_each_process_reads_its_rows_of_the_same_global_batch(tmp_path):
  arrays = _written(tmp_path)
  whole = _ids(example_arrays.batches(arrays, {'y': ()}, 4, num_epochs=2))
  halves = [_ids(example_arrays.batches(arrays, {'y': ()}, 4, num_epochs=2,
                                        process_index=p, process_count=2))
            for p in range(2)]
  assert [a + b for a, b in zip(*halves)] == whole


@pytest.mark.unit
def test_a_short_last_batch_is_kept_when_asked(tmp_path):
  arrays = _written(tmp_path)
  assert _ids(example_arrays.batches(arrays, {'y': ()}, 4, shuffle=False,
                                     num_epochs=1, drop_remainder=False)) == [
      [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.unit
def test_other_shapes_or_fingerprints_are_refused_naming_both(tmp_path):
  arrays = _written(tmp_path)
  with pytest.raises(errors.BadConfig, match=r'x \(4,\) \(arrays\) vs '
                     r'\(5,\) \(run\)'):
    arrays.check({'x': (5,)})
  with pytest.raises(errors.IndexMismatchError,
                     match='vocab_fingerprint v, but this run reads w'):
    arrays.check({'x': (4,)}, vocab_fingerprint='w')
  arrays.check({'x': (4,)}, vocab_fingerprint='v')


@pytest.mark.unit
@pytest.mark.parametrize('name', ['x.npy', 'y.npy', example_arrays.METADATA])
def test_a_flipped_bit_is_refused_naming_the_file(tmp_path, name):
  """Unguarded, a flipped token id would be trained on as it is."""
  _written(tmp_path)
  flipped = tmp_path / 't' / 'train' / name
  flip_a_bit(flipped)
  with pytest.raises(errors.ChecksumMismatch,
                     match=f'{flipped}: CRC-32C .* says'):
    example_arrays.ExampleArrays(tmp_path / 't' / 'train')


@pytest.mark.unit
def test_missing_arrays_say_how_to_make_them(tmp_path):
  with pytest.raises(errors.NotFound, match='realm-jax data export'):
    example_arrays.ExampleArrays(tmp_path / 'nothing')


def _seqio(task, split, shapes, **kwargs):
  return list(SeqioSource().batches(task, split, shapes, **kwargs))


@pytest.mark.integration
@pytest.mark.parametrize('task, split, shapes', [
    (task_names.ict('wiki_leads'), 'train', ICT_SHAPES),
    # Drawn from the corpus's span arrays (tests/test_masked_queries.py).
    (task_names.held_out('wiki_leads'), 'validation', MLM_SHAPES)])
def test_arrays_hold_the_seqio_tasks_examples_token_for_token(
    small_corpus_env, tmp_path, task, split, shapes):
  SeqioSource().export(task, split, shapes, seed=7, root=str(tmp_path),
                       corpus_name='wiki_leads')
  expected = _seqio(task, split, shapes, batch_size=4, seed=7, shuffle=False,
                    num_epochs=1, drop_remainder=False)
  source = ArraysSource(str(tmp_path))
  read = list(source.batches(task, split, shapes, 4, seed=7, shuffle=False,
                             num_epochs=1, drop_remainder=False))
  assert len(read) == len(expected) > 1
  for ours, theirs in zip(read, expected):
    assert set(ours) == set(shapes)
    for name in shapes:
      np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  assert source.example_count(task, split, shapes) == sum(
      len(b['query_token_ids']) for b in expected)


@pytest.mark.integration
def test_arrays_of_a_changed_corpus_are_refused(small_corpus_env, tmp_path):
  task = task_names.ict('wiki_leads')
  SeqioSource().export(task, 'train', ICT_SHAPES, root=str(tmp_path),
                       corpus_name='wiki_leads')
  metadata = tmp_path / task / 'train' / example_arrays.METADATA
  written = json.loads(metadata.read_text())
  metadata.write_text(json.dumps({**written, 'corpus_fingerprint': 'f00'}))
  checksums.write(metadata.parent)  # As if exported from that corpus.
  with pytest.raises(errors.IndexMismatchError,
                     match=f'corpus_fingerprint f00, but this run reads '
                     f'{written["corpus_fingerprint"]}'):
    ArraysSource(str(tmp_path)).batches(task, 'train', ICT_SHAPES, 4)
  # Their count is the export's: a run scored after its corpus was edited
  # (the world's edit check) still says how many queries an epoch held.
  assert ArraysSource(str(tmp_path)).example_count(
      task, 'train', ICT_SHAPES) == written['count'] > 0
