"""The bundle that travels (launch/bundle.py): built from the small corpus with
the tiny model's runs and a stand-in wheel, so no network is needed; its
parts, sizes and fingerprints, MiniLM loading back from it, and `check`
refusing a bundle whose parts do not belong together."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors import safe_open

from launch import bundle
from realm_jax import checksums, default_files, errors
from realm_jax.data import block_store, corpus
from realm_jax.models import pretrained
from tests import test_tf_free
from tests.helpers import REPO, RETRIEVAL, TINY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNS = [f'--run=gin/runs/{run}.gin,gin/models/tiny.gin'
        for run in ('ict', 'pretrain')] + [
            # A binding of this run alone: the reader's warm-start masking.
            "--run=gin/runs/pretrain.gin,gin/models/tiny.gin,"
            "Pretrain.masking='random_uniform'"]
GIN = [flag for flag in TINY if flag.startswith('--gin.')] + [
    '--gin.Ict.block_length=64', '--gin.Ict.query_length=32', *RETRIEVAL]


@pytest.fixture(scope='module')
def wheels(tmp_path_factory):
  directory = tmp_path_factory.mktemp('wheels')
  (directory / 'stand_in-1.0-py3-none-any.whl').write_bytes(b'PK not a wheel')
  return directory


@pytest.fixture(scope='module')
def built(tmp_path_factory, small_corpus, wheels):
  """The bundle's directory and what the command printed."""
  output = tmp_path_factory.mktemp('built') / 'bundle'
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(corpus.CORPUS_ROOT_ENV, small_corpus)
    code = bundle.main([f'--output_dir={output}', *RUNS, *GIN,
                        f'--wheels_from={wheels}'])
  assert code == 0
  return output


def _manifest(directory):
  return json.loads((directory / bundle.MANIFEST).read_text())


def test_the_bundle_holds_every_part_under_the_limit(built, small_corpus):
  manifest = _manifest(built)
  source = corpus.load_metadata(os.path.join(small_corpus, 'wiki_leads'))
  fingerprint = source['corpus_fingerprint']
  assert manifest['corpus_fingerprints'] == {'wiki_leads': fingerprint}
  assert manifest['vocab_fingerprint'] == source['vocab_hash'] == (
      corpus.vocab_hash(default_files.task_vocab()))
  assert manifest['git_commit']
  assert os.listdir(built / 'wheels') == ['stand_in-1.0-py3-none-any.whl']
  # The corpus is its metadata and block store: no TFRecord shard.
  corpus_dir = built / 'corpora' / 'wiki_leads'
  store = f'{block_store.PREFIX}{fingerprint[:16]}'
  assert sorted(os.listdir(corpus_dir)) == [store, 'metadata.json']
  assert sorted(os.listdir(corpus_dir / store)) == sorted(
      [*(f'{name}.npy' for name in block_store.ARRAYS), checksums.MANIFEST])
  checksums.verify(corpus_dir / store)
  # Its pieces too: `ask` on the GPU machine checks what it reads.
  assert checksums.open_pieces(corpus_dir / store) is not None
  assert np.load(corpus_dir / store / 'title_lengths.npy').shape == (
      source['num_blocks'],)
  runs = manifest['parts']['arrays']['runs']
  assert [run['kind'] for run in runs] == ['Ict', 'Pretrain', 'Pretrain']
  own = "Pretrain.masking = 'random_uniform'"
  assert [own in run['gin_bindings'] for run in runs] == [False, False, True]
  # Both maskings draw from the corpus's spans: no masked copies travel.
  spans = ['salient_spans_wiki_leads/train',
           'salient_spans_wiki_leads/validation']
  assert runs[1]['arrays'] == runs[2]['arrays'] == spans
  assert sorted(os.listdir(built / 'arrays')) == [
      'ict_wiki_leads', 'salient_spans_wiki_leads']
  for run in runs:
    for where in run['arrays']:
      arrays = json.loads((built / 'arrays' / where / 'metadata.json'
                           ).read_text())
      assert arrays['vocab_fingerprint'] == manifest['vocab_fingerprint']
      assert arrays['corpus_fingerprint'] == fingerprint
      assert arrays.get('count', arrays.get('spans')) > 0
  assert sorted(os.listdir(built / 'minilm')) == [
      'config.json', 'model.safetensors', 'vocab.txt']
  # Every byte is counted, and the whole is under the limit.
  on_disk = sum(f.stat().st_size for f in built.rglob('*') if f.is_file())
  parts = sum(part['bytes'] for part in manifest['parts'].values())
  assert on_disk == parts + (built / bundle.MANIFEST).stat().st_size
  assert on_disk <= bundle.LIMIT_MIB * bundle.MIB == manifest['limit_bytes']
  assert manifest['use']['env']['REALM_VOCAB'] == os.path.join(
      str(built), 'minilm', 'vocab.txt')
  assert "Examples.source = 'arrays'" in manifest['use']['gin_bindings']
  assert not list(built.parent.glob('*.incomplete-*'))


def test_minilm_travels_in_float16_and_loads_back_as_float32(built):
  """Half MiniLM's bytes, in the form `pretrained.load_bert_params` reads:
  float32 parameters equal to the float16-rounded originals."""
  with safe_open(str(built / 'minilm' / 'model.safetensors'), 'np') as f:
    dtypes = {str(f.get_slice(key).get_dtype()) for key in f.keys()}
  assert dtypes == {'F16', 'I64'}  # I64: position_ids, which are not loaded.
  assert _manifest(built)['parts']['minilm']['dtype'] == 'float16'
  config = pretrained.config_from_hf(built / 'minilm' / 'config.json')
  carried = pretrained.load_bert_params(str(built / 'minilm'), config)
  original = pretrained.load_bert_params(default_files.minilm_dir(), config)
  for got, want in zip(jax.tree.leaves(carried), jax.tree.leaves(original)):
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float16).astype(
        np.float32))


def test_check_passes_without_the_tf_stack(built, tmp_path):
  done = subprocess.run(
      [sys.executable, '-m', 'launch.bundle', f'--check={built}'],
      env=test_tf_free._without_tf(tmp_path), cwd=REPO,  # pylint: disable=protected-access
      capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'a whole bundle' in done.stdout


def _copy(built, tmp_path):
  copy = tmp_path / 'bundle'
  shutil.copytree(built, copy)
  return copy


def test_check_refuses_another_vocabulary_naming_both(built, tmp_path,
                                                      capsys):
  copy = _copy(built, tmp_path)
  vocab = copy / bundle.VOCAB
  vocab.write_text(vocab.read_text() + 'zebra\n')
  with pytest.raises(errors.IndexMismatchError) as refused:
    bundle.check(copy)
  message = str(refused.value)
  assert _manifest(built)['vocab_fingerprint'] in message
  assert corpus.vocab_hash(vocab) in message
  assert bundle.main([f'--check={copy}']) == 2
  err = capsys.readouterr().err
  assert err.startswith('launch.bundle: ') and err.count('\n') == 1


def test_check_refuses_arrays_of_another_corpus_naming_both(built, tmp_path):
  copy = _copy(built, tmp_path)
  path = copy / 'corpora' / 'wiki_leads' / 'metadata.json'
  metadata = json.loads(path.read_text())
  ours = metadata['corpus_fingerprint']
  metadata['corpus_fingerprint'] = 'f' * 64
  path.write_text(json.dumps(metadata))
  with pytest.raises(errors.IndexMismatchError) as refused:
    bundle.check(copy)
  assert ours in str(refused.value) and 'f' * 64 in str(refused.value)


def test_check_refuses_a_damaged_file(built, tmp_path):
  copy = _copy(built, tmp_path)
  damaged = next((copy / 'arrays').rglob('*.npy'))
  damaged.write_bytes(damaged.read_bytes()[:-1])
  with pytest.raises(errors.BadInput, match='is damaged'):
    bundle.check(copy)


def test_check_names_a_truncated_metadata_file(built, tmp_path):
  copy = _copy(built, tmp_path)
  path = next((copy / 'arrays').rglob('metadata.json'))
  path.write_text(path.read_text()[:20])
  with pytest.raises(errors.BadInput, match=f'{path} is damaged: not JSON'):
    bundle.check(copy)


def test_a_bundle_over_the_limit_is_refused_naming_the_sizes(
    small_corpus_env, wheels, tmp_path, capsys):
  output = tmp_path / 'bundle'
  assert bundle.main([f'--output_dir={output}', RUNS[0], *GIN,
                      f'--wheels_from={wheels}', '--limit_mib=40']) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1, err
  assert 'exceeds the 40 MiB limit: wheels 0.0 MiB, ' in err
  for part in ('arrays', 'corpora', 'minilm', bundle.MANIFEST):
    assert f'{part} ' in err
  assert not os.listdir(tmp_path)  # Neither the bundle nor its staging.


def test_a_directory_that_is_not_a_bundle_is_not_replaced(tmp_path):
  (tmp_path / 'notes.txt').write_text('mine')
  with pytest.raises(errors.BadConfig, match='is not a bundle'):
    bundle.build(str(tmp_path))
  assert os.listdir(tmp_path) == ['notes.txt']

