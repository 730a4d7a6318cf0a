"""The run directory's guards: one trainer per model_dir (two real processes
for the lock), the layout recorded and checked, a damaged newest checkpoint
set aside for the step before, a checkpoint of other code refused, and a
save on a full disk stopped naming the last good step."""

import contextlib
import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint._src.serialization import serialization

import realm_jax
from realm_jax import checksums, errors, run_directory, run_guard
from realm_jax.errors import CheckpointMismatch, CheckpointSaveFailed
from realm_jax.index import corpus_sync
from realm_jax.models import bert
from realm_jax.training.checkpoints import Checkpoints
from realm_jax.training.train_state import TrainState
from tests.helpers import REPO, flip_a_bit, largest_file

# Orbax leaves reads of a damaged step's other arrays running after the
# failed restore; they find their event loop closed.
pytestmark = pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnraisableExceptionWarning')

# A trainer stand-in: takes the lock, says so, and waits to be killed.
HOLD_LOCK = ('import sys, time\n'
             'from realm_jax import run_guard\n'
             'getattr(run_guard, sys.argv[2])(sys.argv[1]).acquire()\n'
             'print("held", flush=True)\n'
             'time.sleep(300)\n')


def _state(step, reader=True, width=16):
  """A train state (with Adam's moments) whose parameters are all `step`."""
  params = {'retriever': {'kernel': jnp.full((32, width), step, jnp.float32)}}
  if reader:
    params['reader'] = {'bias': jnp.full((5,), step, jnp.float32)}
  return TrainState(step=jnp.asarray(step, jnp.int32), params=params,
                    opt_state=optax.adam(1e-3).init(params),
                    rng=jax.random.PRNGKey(step))


def _abstract(**kwargs):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, _state(0, **kwargs))


def _save(model_dir, *steps):
  writer = Checkpoints(model_dir, save_every=1, keep=5)
  for step in steps:
    writer.save(_state(step), step, {'batches': step}, force=True)
  writer.close()


def _assert_is(state, step):
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(_state(step))):
    np.testing.assert_array_equal(got, want)


def _step_dir(model_dir, step):
  return os.path.join(run_directory.checkpoints_dir(model_dir), str(step))


# 1. One trainer per model_dir.


@contextlib.contextmanager
def _held_elsewhere(model_dir: str, lock: str):
  """A process holding run_guard.<lock> on model_dir until killed."""
  holder = subprocess.Popen(
      [sys.executable, '-c', HOLD_LOCK, model_dir, lock], cwd=REPO,
      stdout=subprocess.PIPE)
  try:
    assert holder.stdout.readline() == b'held\n'
    yield holder
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


@pytest.mark.integration
def test_a_second_trainer_is_refused_until_the_first_is_killed(tmp_path):
  model_dir = str(tmp_path / 'run')
  with _held_elsewhere(model_dir, 'TrainerLock') as holder:
    with pytest.raises(errors.TrainerRunning) as refused:
      run_guard.TrainerLock(model_dir).acquire()
    assert str(refused.value).startswith(
        f'{model_dir} is being trained by pid {holder.pid} on host '
        f'{socket.gethostname()}; stop it first, or use another model_dir')
  # The kernel dropped the lock of the killed holder.
  with run_guard.TrainerLock(model_dir) as lock:
    with open(lock.path, encoding='utf-8') as f:
      assert json.load(f)['pid'] == os.getpid()


@pytest.mark.integration
def test_a_second_index_builder_is_refused_in_one_line(tmp_path):
  """`realm-jax refresh` on a run whose builder is running stops at
  once, before it waits for the run, exit code 2, naming the first; the
  trainer's lock is another."""
  model_dir = str(tmp_path / 'run')
  with _held_elsewhere(model_dir, 'BuilderLock') as holder:
    second = subprocess.run(
        [sys.executable, '-m', 'realm_jax.main', 'refresh',
         f'--model_dir={model_dir}'],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr
    assert (f'{model_dir} has an index builder: pid {holder.pid} on host '
            f'{socket.gethostname()}; stop it first') in second.stderr
    assert 'Traceback' not in second.stderr
    with run_guard.TrainerLock(model_dir):  # A trainer may still start.
      pass


@pytest.mark.unit
def test_a_corpus_sync_beside_a_running_builder_is_refused(tmp_path):
  """`corpus add/remove/sync` publishes index steps, as a builder does."""
  model_dir = str(tmp_path / 'run')
  with run_guard.BuilderLock(model_dir):
    with pytest.raises(errors.BuilderRunning,
                       match=f'has an index builder: pid {os.getpid()}'):
      corpus_sync.sync_index(model_dir, str(tmp_path / 'corpus'),
                             retriever=None)
  with pytest.raises(errors.NotFound, match='No corpus at'):  # Its turn.
    corpus_sync.sync_index(model_dir, str(tmp_path / 'corpus'),
                           retriever=None)


@pytest.mark.unit
def test_the_lock_is_held_until_released(tmp_path):
  model_dir = str(tmp_path / 'run')
  with run_guard.TrainerLock(model_dir):
    with pytest.raises(errors.TrainerRunning,
                       match=f'pid {os.getpid()} on host'):
      run_guard.TrainerLock(model_dir).acquire()
  run_guard.TrainerLock(model_dir).acquire().release()


@pytest.mark.unit
def test_only_process_0_of_a_local_directory_takes_the_lock(
    tmp_path, monkeypatch, caplog):
  with caplog.at_level(logging.INFO, logger='realm_jax'):
    with run_guard.TrainerLock('gs://bucket/run'):
      pass
  assert 'No trainer.lock on gs://bucket/run' in caplog.text
  monkeypatch.setenv('JAX_PROCESS_ID', '1')
  with run_guard.TrainerLock(str(tmp_path)):
    assert not os.path.exists(tmp_path / run_guard.LOCK)


@pytest.mark.unit
def test_a_second_writer_of_an_index_step_waits_then_finds_it_published(
    tmp_path):
  """A trainer with no index yet and the index builder beside it both
  publish step 0. Two writers of one step at once shared Orbax's temporary
  directory, each removing the other's (a trainer's run failed so in the
  suite): the second now waits for the first's lock; a writer after a
  publication finds the step published."""
  import threading  # pylint: disable=g-import-not-at-top
  from realm_jax.index import publication  # pylint: disable=g-import-not-at-top
  index_dir = str(tmp_path / 'index')
  embeddings = np.arange(12, dtype=np.float32).reshape(4, 3)
  metadata = {'step': 0}
  outcome = []

  def second_writer():
    try:
      publication.publish(publication.index_manager(index_dir), 0,
                          embeddings + 1, metadata)
      outcome.append('published')
    except ocp.checkpoint_manager.StepAlreadyExistsError:
      outcome.append('already published')
  with run_guard.PublishLock(index_dir):  # The first writer's.
    writer = threading.Thread(target=second_writer)
    writer.start()
    writer.join(timeout=2)
    # It waits for the lock: nothing of step 0 written, not even its
    # temporary directory.
    assert writer.is_alive() and not outcome
    assert sorted(os.listdir(index_dir)) == [run_guard.PUBLISH_LOCK]
  writer.join(timeout=60)
  assert outcome == ['published']
  with pytest.raises(ocp.checkpoint_manager.StepAlreadyExistsError):
    publication.publish(publication.index_manager(index_dir), 0, embeddings,
                        metadata)
  manager = publication.index_manager(index_dir, read_only=True)
  assert run_directory.reload(manager) == [0]  # The lock file is no step.
  np.testing.assert_array_equal(
      publication.read_embeddings(manager, 0), embeddings + 1)


# 2. The layout a run was written in.


def _format_file(model_dir):
  return os.path.join(model_dir, run_directory.FORMAT_FILE)


def _with_format(model_dir, **changes):
  """A run with a step and a format file that says `changes`."""
  os.makedirs(_step_dir(model_dir, 3))
  with open(_format_file(model_dir), 'w', encoding='utf-8') as f:
    json.dump({**run_guard.current_format(), **changes}, f)


@pytest.mark.unit
def test_a_new_run_records_its_format(tmp_path):
  new = str(tmp_path / 'new')
  assert run_directory.recorded_format(new) is None
  run_guard.check_format(new)
  run_guard.check_format(new)  # A new run killed before its first save.
  with open(_format_file(new), encoding='utf-8') as f:
    assert json.load(f) == run_guard.current_format()
  assert run_directory.recorded_format(new) == run_guard.RUN_FORMAT


@pytest.mark.unit
def test_a_run_from_before_the_format_file_is_format_1_and_refused(
    tmp_path, caplog):
  """Format 1 laid each BERT's layers out one by one; this code stacks
  them (format 2): a trainer cannot resume its optimizer state."""
  old = str(tmp_path / 'old')
  os.makedirs(_step_dir(old, 3))
  assert run_directory.recorded_format(old) == run_directory.UNROLLED_LAYERS_FORMAT
  with caplog.at_level(logging.INFO, logger='realm_jax'):
    with pytest.raises(errors.FormatMismatch,
                       match=f'format 1 there, {run_guard.RUN_FORMAT} here'):
      run_guard.check_format(old)
  assert 'taken as format 1' in caplog.text
  assert not os.path.exists(_format_file(old))


# A BERT's parameters with two unrolled layers (format 1's layout).
_UNROLLED = {'embeddings': {'scale': np.ones(3, np.float32)},
             **{f'layer_{i}': {'output': {'kernel': np.full((2, 3), i,
                                                            np.float32)}}
                for i in range(2)}}


def _save_unrolled(model_dir, format_version):
  """A run whose towers and reader are BERTs with two unrolled layers."""
  params = {'retriever': {'embedder': {'bert': _UNROLLED}},
            'reader': {'bert': _UNROLLED, 'bias': np.zeros(2, np.float32)}}
  writer = Checkpoints(model_dir, save_every=1)
  writer.save(TrainState(step=jnp.asarray(4, jnp.int32), params=params,
                         opt_state=(), rng=jax.random.PRNGKey(0)),
              4, {'batches': 4}, force=True)
  writer.close()
  if format_version is not None:
    with open(_format_file(model_dir), 'w', encoding='utf-8') as f:
      json.dump({**run_guard.current_format(), 'format': format_version}, f)


@pytest.mark.unit
@pytest.mark.parametrize('format_version', [None, 1])
def test_a_format_1_runs_unrolled_layers_are_read_stacked(tmp_path,
                                                          format_version):
  """Warm starts, evaluation and the index builder read a run written
  before the layers were scanned in the layout this code builds."""
  model_dir = str(tmp_path / 'old')
  _save_unrolled(model_dir, format_version)
  step, params = run_directory.restore_params(model_dir)
  assert step == 4
  for stacked in (params['retriever']['embedder']['bert'],
                  params['reader']['bert']):
    assert set(stacked) == {'embeddings', 'layers'}
    np.testing.assert_array_equal(
        stacked['layers']['output']['kernel'][:, 0, 0], [0, 1])
    # As the models' own helper stacks them (the importers use it).
    jax.tree.map(np.testing.assert_array_equal, stacked,
                 bert.stack_layers(_UNROLLED))
  np.testing.assert_array_equal(params['reader']['bias'], [0, 0])
  towers = run_directory.restore_retriever_params(
      run_directory.trainer_checkpoints(model_dir), 4)
  assert set(towers['embedder']['bert']) == {'embeddings', 'layers'}


@pytest.mark.unit
def test_a_format_2_runs_unrolled_layers_stay_unrolled(tmp_path):
  """A run of this code with scan_layers=False saved its layers unrolled;
  they are read as saved."""
  model_dir = str(tmp_path / 'unrolled')
  _save_unrolled(model_dir, run_guard.RUN_FORMAT)
  _, params = run_directory.restore_params(model_dir)
  assert set(params['reader']['bert']) == {'embeddings', 'layer_0',
                                           'layer_1'}


@pytest.mark.unit
@pytest.mark.parametrize('changes,difference', [
    ({'format': 1}, f'format 1 there, {run_guard.RUN_FORMAT} here'),
    ({'checkpoint_items': ['params', 'train_state']},
     "checkpoint items ['params', 'train_state'] there")])
def test_a_run_of_another_layout_is_refused(tmp_path, changes, difference):
  model_dir = str(tmp_path / 'run')
  _with_format(model_dir, realm_jax='0.0.1', **changes)
  with pytest.raises(errors.FormatMismatch) as refused:
    run_guard.check_format(model_dir)
  message = str(refused.value)
  assert message.startswith(f'{_format_file(model_dir)}: this run directory '
                            'was written by realm_jax 0.0.1')
  assert difference in message
  assert message.endswith('Resume it with the code version that wrote it, '
                          'or use a new model_dir.')


@pytest.mark.unit
def test_another_version_of_the_same_layout_is_only_logged(tmp_path, caplog):
  model_dir = str(tmp_path / 'run')
  _with_format(model_dir, realm_jax='0.0.1')
  with caplog.at_level(logging.WARNING, logger='realm_jax'):
    run_guard.check_format(model_dir)
  assert (f'written by realm_jax 0.0.1, this is {realm_jax.__version__}'
          in caplog.text)
  with open(_format_file(model_dir), encoding='utf-8') as f:
    assert json.load(f)['realm_jax'] == '0.0.1'


@pytest.mark.unit
def test_an_unreadable_format_file_is_refused(tmp_path):
  model_dir = str(tmp_path / 'run')
  os.makedirs(_step_dir(model_dir, 3))
  with open(_format_file(model_dir), 'w', encoding='utf-8') as f:
    f.write('{"format": 1,')
  with pytest.raises(errors.FormatMismatch, match='is unreadable'):
    run_guard.check_format(model_dir)


# 2. A checkpoint of other code or config; 3. damaged checkpoints.


@pytest.mark.unit
@pytest.mark.parametrize('code,difference', [
    ({'reader': False},
     "it holds the items ['data_position', 'reader_params', "
     "'retriever_params', 'train_state'], this code restores "
     "['data_position', 'retriever_params', 'train_state']"),
    ({'width': 8},
     'its retriever_params differs from the trees this code and config '
     'build (kernel has shape (32, 16) there, (32, 8) here)')],
    ids=['no reader', 'a narrower kernel'])
def test_a_checkpoint_of_other_code_stops_the_run_and_stays(
    tmp_path, code, difference):
  model_dir = str(tmp_path / 'run')
  _save(model_dir, 1, 2)
  with pytest.raises(CheckpointMismatch) as refused:
    Checkpoints(model_dir, 1).restore_newest(_abstract(**code))
  message = str(refused.value)
  assert message.startswith(f'Checkpoint {_step_dir(model_dir, 2)} does not '
                            'match this code')
  assert difference in message
  assert os.path.isdir(_step_dir(model_dir, 2))


def _cut_short(path):
  os.truncate(path, os.path.getsize(path) // 2)


def _garble(path):
  with open(path, 'w', encoding='utf-8') as f:
    f.write('{"batches": 2')


def _in(directory, damage):
  """`damage` applied to every file of `directory`."""
  def damage_all(path):
    for name in os.listdir(os.path.join(path, directory)):
      damage(os.path.join(path, directory, name))
  return damage_all


def _write_bytes(path, data: bytes):
  with open(path, 'wb') as f:
    f.write(data)


# Each damage, the file and problem named when the step carries no
# checksums (written before realm-jax kept them), and what Orbax did
# unguarded. With checksums, the damaged file is named by them.
DAMAGE = {
    # ValueError OUT_OF_RANGE from TensorStore.
    'array data cut short': (_in('retriever_params/d', _cut_short),
                             r'/2/retriever_params/d/\w+: OUT_OF_RANGE'),
    # json.JSONDecodeError.
    'garbled data position': (
        lambda step: _garble(os.path.join(step, 'data_position/metadata')),
        r'/2/data_position/metadata: not JSON'),
    # UnicodeDecodeError, which the tree reads met first.
    'data position not UTF-8': (
        lambda step: _write_bytes(os.path.join(step, 'data_position/metadata'),
                                  b'\x8b\x88\xff garbage'),
        r'/2/data_position/metadata: not JSON'),
    # json.JSONDecodeError.
    'tree metadata cut short': (
        lambda step: _cut_short(os.path.join(step, 'train_state/_METADATA')),
        r'/2/train_state/_METADATA: not JSON'),
    # ValueError: a pytree structure error, as if the code had changed.
    'tree metadata missing': (
        lambda step: os.remove(os.path.join(step, 'train_state/_METADATA')),
        r'/2/train_state: Metadata file \(named _METADATA\) does not '),
    # ValueError NOT_FOUND from TensorStore.
    'manifest missing': (
        lambda step: os.remove(os.path.join(step,
                                            'reader_params/manifest.ocdbt')),
        r'/2/reader_params/: NOT_FOUND'),
    # Nothing: restored as if whole.
    'commit marker missing': (
        lambda step: os.remove(os.path.join(step, 'commit_success.txt')),
        r'/2/commit_success.txt: missing'),
}
BY_CHECKSUMS = (r'/2/\w+/\S+: (CRC-32C [0-9a-f]{8}, but checksums.json says|'
                r'missing, though checksums.json lists it)')


def _unchecked(step_dir: str) -> None:
  """The step as realm-jax wrote it before it kept checksums."""
  for item in os.listdir(step_dir):
    manifest = os.path.join(step_dir, item, checksums.MANIFEST)
    if os.path.exists(manifest):
      os.remove(manifest)


@pytest.mark.unit
@pytest.mark.parametrize('checked', [True, False],
                         ids=['with checksums', 'without'])
@pytest.mark.parametrize('damage', list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_set_aside_for_the_one_before(
    tmp_path, caplog, damage, checked):
  model_dir = str(tmp_path / 'run')
  _save(model_dir, 1, 2)
  spoil, named = DAMAGE[damage]
  if not checked:
    _unchecked(_step_dir(model_dir, 2))
  elif damage != 'commit marker missing':  # Looked at before checksums.
    named = BY_CHECKSUMS
  spoil(_step_dir(model_dir, 2))
  _assert_set_aside_for_step_1(model_dir, caplog, named)


@pytest.mark.unit
def test_a_bit_flipped_in_a_checkpoint_is_named_by_its_checksum(
    tmp_path, caplog):
  """Unguarded, the flipped value would be restored."""
  model_dir = str(tmp_path / 'run')
  _save(model_dir, 1, 2)
  flipped = largest_file(os.path.join(_step_dir(model_dir, 2),
                                      'reader_params'))
  flip_a_bit(flipped)
  _assert_set_aside_for_step_1(
      model_dir, caplog, re.escape(flipped) + r': CRC-32C [0-9a-f]{8}, but '
      r'checksums.json says [0-9a-f]{8}: its bytes changed after it was '
      'written')


def _assert_set_aside_for_step_1(model_dir: str, caplog, named: str):
  """Restoring the newest step passes over step 2, naming `named`, resumes
  from step 1, and sets step 2 aside for the run to save it anew."""
  checkpoints = Checkpoints(model_dir, 1)
  with caplog.at_level(logging.WARNING, logger='realm_jax'):
    step, state, position = checkpoints.restore_newest(_abstract())
  assert (step, position) == (1, {'batches': 1})
  _assert_is(state, 1)
  damaged = f'Step {_step_dir(model_dir, 2)} is damaged: '
  assert damaged in caplog.text
  assert re.search(named, caplog.text.split(damaged)[1].splitlines()[0])
  corrupt = os.path.join(run_directory.checkpoints_dir(model_dir),
                         run_directory.DAMAGED)
  aside, = os.listdir(corrupt)
  assert aside.startswith('2-') and os.path.join(corrupt, aside) in caplog.text
  assert 'Resuming from checkpoint step 1' in caplog.text
  assert not os.path.exists(_step_dir(model_dir, 2))
  # The run saves step 2 anew; the damaged one stays where it was put.
  assert checkpoints.latest_step() == 1
  checkpoints.save(_state(2), 2, {'batches': 2}, force=True)
  checkpoints.close()
  assert Checkpoints(model_dir, 1).latest_step() == 2
  assert os.listdir(corrupt) == [aside]


@pytest.mark.unit
def test_every_checkpoint_damaged_stops_the_run_and_moves_none(tmp_path):
  model_dir = str(tmp_path / 'run')
  _save(model_dir, 1, 2)
  for step in (1, 2):
    os.remove(os.path.join(_step_dir(model_dir, step), 'train_state',
                           'manifest.ocdbt'))
  with pytest.raises(RuntimeError,
                     match=r'Every checkpoint in .* is damaged \(steps '
                           r'\[1, 2\]'):
    Checkpoints(model_dir, 1).restore_newest(_abstract())
  assert all(os.path.isdir(_step_dir(model_dir, s)) for s in (1, 2))


@pytest.mark.unit
def test_no_checkpoint_restores_none(tmp_path):
  assert Checkpoints(str(tmp_path / 'run'), 1).restore_newest(
      _abstract()) is None


@pytest.mark.integration
def test_checkpoints_at_multiples_of_keep_every_outlive_the_newest(tmp_path):
  """What a run's training is scored at afterwards: the newest 2, and every
  5th step besides, each still restorable."""
  model_dir = str(tmp_path / 'run')
  writer = Checkpoints(model_dir, save_every=1, keep=2, keep_every=5)
  for step in range(12):
    writer.save(_state(step), step, {'batches': step}, force=step == 0)
  writer.close()
  assert run_directory.reload(writer.manager) == [0, 5, 10, 11]
  with pytest.raises(errors.BadConfig, match='train.keep_every=0'):
    Checkpoints(model_dir, save_every=1, keep_every=0)


# 4. A save on a full disk.


def _full_disk(monkeypatch, error):
  """The array writes of saves from now on raise `error`, after the first
  one's (a half-written step)."""
  real = serialization.async_serialize_from_host
  written = []

  async def write(*args, **kwargs):
    if written:
      raise error
    written.append(True)
    await real(*args, **kwargs)

  monkeypatch.setattr(serialization, 'async_serialize_from_host', write)


@pytest.mark.unit
@pytest.mark.parametrize('surfaces', ['at the next save', 'at the wait'])
@pytest.mark.parametrize('error', [
    OSError(errno.ENOSPC, 'No space left on device'),
    # What TensorStore raises on a full tmpfs.
    ValueError('RESOURCE_EXHAUSTED: Error writing local file "manifest.ocdbt"'
               ': Failed to write 113 bytes to file 7: No space left on '
               "device [os_error_code='28']")], ids=['python', 'tensorstore'])
def test_a_full_disk_stops_the_run_naming_the_last_good_checkpoint(
    tmp_path, monkeypatch, surfaces, error):
  model_dir = str(tmp_path / 'run')
  checkpoints = Checkpoints(model_dir, 1)
  checkpoints.save(_state(1), 1, {'batches': 1})
  checkpoints.wait()
  _full_disk(monkeypatch, error)
  assert checkpoints.save(_state(2), 2, {'batches': 2})
  with pytest.raises(CheckpointSaveFailed) as failed:
    if surfaces == 'at the wait':
      checkpoints.wait()
    else:
      checkpoints.save(_state(3), 3, {'batches': 3})
  assert str(failed.value) == (
      f'Saving checkpoint step 2 to {checkpoints.directory} failed: No space '
      'left on device; the last good checkpoint is step 1.')
  assert failed.value.errno == errno.ENOSPC
  assert '2.orbax-checkpoint-tmp' in os.listdir(checkpoints.directory)
  monkeypatch.undo()
  checkpoints.close()
  # The next start sees step 1 alone, whole; its first save deletes the
  # half of step 2 before it saves step 2 anew.
  resumed = Checkpoints(model_dir, 1)
  step, state, _ = resumed.restore_newest(_abstract())
  assert step == 1
  _assert_is(state, 1)
  resumed.save(_state(2), 2, {'batches': 2})
  resumed.close()
  assert sorted(os.listdir(resumed.directory)) == ['1', '2']


@pytest.mark.integration
def test_a_run_read_with_another_vocabulary_is_refused(trained_pretraining,
                                                       tmp_path, monkeypatch):
  """The trainer records its vocabulary; a run read under another one, even
  of the same size (BERT's with two wordpieces swapped: other ids), is
  refused, naming both files and $REALM_VOCAB. A run that recorded none
  (written before, or imported) is read as before."""
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader, step_inputs  # pylint: disable=g-import-not-at-top
  assert (step_inputs.check_trained_vocabulary(trained_pretraining)
          == step_inputs.task_vocabulary())
  with open(default_files.task_vocab(), encoding='utf-8') as f:
    pieces = f.read().splitlines()
  pieces[1000], pieces[1001] = pieces[1001], pieces[1000]
  other = tmp_path / 'other_vocab.txt'
  other.write_text('\n'.join(pieces) + '\n')
  monkeypatch.setenv(default_files.VOCAB_ENV, str(other))
  with pytest.raises(errors.BadConfig) as refused:
    run_loader.load_run(trained_pretraining)
  message = errors.message(refused.value)
  assert str(other) in message and '$REALM_VOCAB' in message
  assert run_directory.VOCABULARY in message
  unrecorded = tmp_path / 'run'
  unrecorded.mkdir()
  for name in (run_directory.CONFIG, run_directory.FORMAT_FILE):
    with open(os.path.join(trained_pretraining, name), encoding='utf-8') as f:
      (unrecorded / name).write_text(f.read())
  assert step_inputs.check_trained_vocabulary(str(unrecorded)) is None
