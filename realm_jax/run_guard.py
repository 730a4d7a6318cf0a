"""What keeps a trainer or a builder from damaging a run directory it
should not touch.

Three files in model_dir, next to those `run_directory` describes:
  trainer.lock      locked (flock) by the trainer for its whole life, naming
                    its pid and host: a second trainer on the same directory
                    would interleave its checkpoints and indexes with the
                    first one's;
  builder.lock      the same for the index builder (`realm-jax refresh`):
                    two builders would both publish;
  run_format.json   the layout the run's checkpoints were written in: code
                    that lays them out differently must not resume them.
And one in the index directory:
  publish.lock      locked (flock) while an index step is written: a trainer
                    with no index yet and the builder beside it both embed
                    step 0, and two writers of one step share Orbax's
                    temporary directory, each removing the other's.
"""

import fcntl
import json
import logging
import os
import socket

from etils import epath

import realm_jax
from realm_jax import distributed, errors, run_directory
from realm_jax.errors import BuilderRunning, FormatMismatch, TrainerRunning
from realm_jax.run_directory import (DATA_POSITION, FIRST_FORMAT, FORMAT_FILE,
                                    TRAIN_STATE, params_item)

log = logging.getLogger(__name__)

LOCK = 'trainer.lock'
BUILDER_LOCK = 'builder.lock'
PUBLISH_LOCK = 'publish.lock'
# The run directory's layout. Bump it with any change that makes the code
# read an existing run directory differently. 2: each BERT's layers stacked
# under 'layers' (nn.scan), where 1 had `layer_0`, `layer_1`, ...
RUN_FORMAT = 2
# What a command that only reads a run reads: format 1's layers are stacked
# as they are read (`run_directory.restore_params`).
READABLE_FORMATS = (run_directory.UNROLLED_LAYERS_FORMAT, RUN_FORMAT)
CHECKPOINT_ITEMS = sorted([params_item('retriever'), params_item('reader'),
                           TRAIN_STATE, DATA_POSITION])


class RunLock:
  """An exclusive lock on model_dir for one process of a kind (`FILE`),
  held until `release` (or the end of a `with` block).

  The kernel drops a flock when the process holding it dies, however it
  dies, so a killed process never blocks the next one. Process 0 alone
  takes it (a run's processes share the directory). A model_dir that is a
  URL gets none: flock only works on a local (or NFS) file.
  """
  FILE = ''
  ERROR = errors.UserError
  HELD_BY = ''  # '<model_dir> <HELD_BY> pid N on host H'.

  def __init__(self, model_dir: str):
    self.model_dir = model_dir
    self.path = os.path.join(model_dir, self.FILE)
    self._file = None

  def acquire(self) -> 'RunLock':
    """Takes the lock, or raises `ERROR` naming its holder."""
    if distributed.process_index():
      return self
    if '://' in self.model_dir:
      log.info('No %s on %s (not a local directory): nothing stops a '
               'second one there.', self.FILE, self.model_dir)
      return self
    epath.Path(self.model_dir).mkdir(parents=True, exist_ok=True)
    # Opened without truncating: the holder's pid stays readable.
    descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _holder(descriptor)
      os.close(descriptor)
      raise self.ERROR(
          f'{self.model_dir} {self.HELD_BY} {holder}; stop it first, '
          f'or use another model_dir (lock: {self.path}).') from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(
        {'pid': os.getpid(), 'host': socket.gethostname()}).encode(), 0)
    self._file = descriptor
    return self

  def release(self) -> None:
    if self._file is None:
      return
    # Emptied before the lock goes: no later reader takes this process for
    # the holder.
    os.ftruncate(self._file, 0)
    os.close(self._file)
    self._file = None

  def __enter__(self) -> 'RunLock':
    return self.acquire()

  def __exit__(self, *unused_exception) -> None:
    self.release()


class TrainerLock(RunLock):
  """The trainer's: a second trainer would interleave its checkpoints and
  indexes with the first one's."""
  FILE, ERROR, HELD_BY = LOCK, TrainerRunning, 'is being trained by'


class BuilderLock(RunLock):
  """The index builder's: two builders would both publish, each pruning
  what the other wrote."""
  FILE, ERROR, HELD_BY = BUILDER_LOCK, BuilderRunning, 'has an index builder:'


class PublishLock:
  """Waits for and holds an exclusive lock on an index directory while one
  step is written (the index's `publish.lock`). As RunLock: process 0 alone
  takes it (the others write under its collective save), the kernel drops
  it when its holder dies, and a URL gets none."""

  def __init__(self, index_dir: str):
    self.index_dir = str(index_dir)
    self._file = None

  def __enter__(self) -> 'PublishLock':
    if distributed.process_index() or '://' in self.index_dir:
      return self
    epath.Path(self.index_dir).mkdir(parents=True, exist_ok=True)
    self._file = os.open(os.path.join(self.index_dir, PUBLISH_LOCK),
                         os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(self._file, fcntl.LOCK_EX)
    return self

  def __exit__(self, *unused_exception) -> None:
    if self._file is not None:
      os.close(self._file)
      self._file = None


def _holder(descriptor: int) -> str:
  """'pid N on host H' from a held lock file."""
  try:
    holder = json.loads(os.pread(descriptor, 4096, 0))
    return f'pid {holder["pid"]} on host {holder["host"]}'
  except (ValueError, KeyError, TypeError):
    return 'another process (which has not written its pid yet)'


def current_format() -> dict:
  return {'format': RUN_FORMAT, 'checkpoint_items': CHECKPOINT_ITEMS,
          'realm_jax': realm_jax.__version__}


def check_format(model_dir: str) -> None:
  """Refuses (FormatMismatch) a run directory whose checkpoints were
  written in another layout than this code's, before anything reads them:
  another format version, or other checkpoint item names. Another
  realm_jax version alone is only logged.

  A run directory with checkpoints but no format file was written before
  the file existed, in the first format: it is checked as that, and the
  file is written. So is a directory without checkpoints (a new run).
  """
  path = epath.Path(model_dir) / FORMAT_FILE
  if run_directory.has_checkpoints(model_dir):
    if path.exists():
      _compare(_read(path), str(path))
      return
    log.info('%s has checkpoints but no %s (they predate it): taken as '
             'format %d.', model_dir, FORMAT_FILE, FIRST_FORMAT['format'])
    _compare(FIRST_FORMAT, f'{model_dir} (no {FORMAT_FILE}: format 1)')
  if distributed.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.parent / (FORMAT_FILE + '.tmp')
    written.write_text(json.dumps(current_format(), indent=2) + '\n')
    written.replace(path)  # Whole for other processes reading it meanwhile.


def check_readable(model_dir: str) -> None:
  """Refuses (FormatMismatch) a run directory that a command reading it
  (`run_loader.load_run`) would misread: a format file it cannot read, or
  one that names another layout than this code's or format 1's (whose
  layers are stacked as they are read). Writes nothing."""
  path = epath.Path(model_dir) / FORMAT_FILE
  if path.exists():
    _compare(_read(path), str(path), READABLE_FORMATS,
             'Read it with the code version that wrote it.')


def _read(path: epath.Path) -> dict:
  try:
    recorded = json.loads(path.read_text())
    if not isinstance(recorded, dict):
      raise ValueError(f'a JSON {type(recorded).__name__}, not an object')
    return recorded
  except ValueError as error:
    formats = {key: current_format()[key]
               for key in ('format', 'checkpoint_items')}
    raise FormatMismatch(
        f'{path} is unreadable ({error}). If this code version wrote the '
        f'run, write {json.dumps(formats)} into it; otherwise use the '
        'version that wrote the run, or a new model_dir.') from error


def _compare(recorded: dict, source: str, formats=(RUN_FORMAT,),
             advice: str = 'Resume it with the code version that wrote it, '
             'or use a new model_dir.') -> None:
  """Raises FormatMismatch unless `recorded` is of one of `formats`, with
  this code's checkpoint items."""
  current = current_format()
  differences = [
      f'{name} {recorded.get(key)!r} there, {current[key]!r} here'
      for key, name, same in (
          ('format', 'format', recorded.get('format') in formats),
          ('checkpoint_items', 'checkpoint items',
           recorded.get('checkpoint_items') == current['checkpoint_items']))
      if not same]
  written_by = recorded.get('realm_jax', 'an unrecorded version')
  if differences:
    raise FormatMismatch(
        f'{source}: this run directory was written by realm_jax {written_by} '
        f'in another layout than this code reads: {"; ".join(differences)}. '
        + advice)
  if 'realm_jax' in recorded and written_by != current['realm_jax']:
    log.warning('%s was written by realm_jax %s, this is %s; its layout is '
                'the same, so the run goes on.', source, written_by,
                current['realm_jax'])
