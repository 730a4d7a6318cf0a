"""What a trainer records of its run (run.json) for the run's index builder,
without training: its corpus, block cut, cadence and environment."""

import types

import gin
import pytest

from realm_jax import default_files, errors, run_directory
from realm_jax.data import corpus, example_arrays, open_qa
from realm_jax.index import refresh  # pylint: disable=unused-import
from realm_jax.training import run_loader

pytestmark = pytest.mark.unit


@pytest.fixture
def environment(monkeypatch, tmp_path):
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(tmp_path / 'corpora'))
  monkeypatch.setenv(open_qa.DATA_DIR_ENV, str(tmp_path / 'data'))
  monkeypatch.delenv(example_arrays.ROOT_ENV, raising=False)
  monkeypatch.delenv(default_files.VOCAB_ENV, raising=False)
  monkeypatch.setenv('REALM_JAX_VERBOSE', '1')  # The machine's: not kept.
  yield tmp_path
  gin.clear_config()


def test_the_record_holds_the_cadence_bound_and_the_variables_set(
    environment):
  gin.clear_config()
  gin.parse_config('INTERVAL = 20\n'
                   'run_refresh.refresh_interval_steps = %INTERVAL')
  run = types.SimpleNamespace(corpus_name='world', block_length=52)
  assert run_loader.run_record(run) == {
      'kind': 'SimpleNamespace',
      # A corpus not built (yet): named, with no fingerprint.
      'corpus': {'name': 'world',
                 'dir': str(environment / 'corpora' / 'world'),
                 'fingerprint': None},
      'block_length': 52,
      'refresh': {'refresh_interval_steps': 20, 'stale_factor': None},
      'environment': {corpus.CORPUS_ROOT_ENV: str(environment / 'corpora'),
                      open_qa.DATA_DIR_ENV: str(environment / 'data')}}


def test_a_record_is_written_whole_and_a_damaged_one_refused(tmp_path):
  model_dir = str(tmp_path)
  assert run_directory.read_record(model_dir) is None
  run_directory.write_record(model_dir, {'block_length': None})
  assert run_directory.read_record(model_dir) == {'block_length': None}
  assert [p.name for p in tmp_path.iterdir()] == ['run.json']
  (tmp_path / 'run.json').write_text('{"block_len')
  with pytest.raises(errors.BadInput, match='run.json is damaged'):
    run_directory.read_record(model_dir)
