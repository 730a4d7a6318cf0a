"""The run directory: the only contract between the trainer and the builder.

The two jobs share nothing but one model_dir:
  config.gin                the trainer's operative gin config (what
                            `load_run` rebuilds the run from);
  vocabulary.json           the wordpiece vocabulary it was trained with
                            (file, size, sha256), which every reader of
                            the run must read too;
  run.json                  what else a reader of the run needs and
                            config.gin does not say, written by the
                            trainer as it starts (`run_loader.run_record`):
                            its kind; its corpus (name, absolute directory,
                            fingerprint); the block length it reads; the
                            refresh cadence it was given
                            (run_refresh.refresh_interval_steps and
                            stale_factor, null where not bound); and the
                            REALM_* variables set that chose its data. The
                            index builder embeds as it says;
  trainer.lock, run_format.json
                            the trainer's lock and the layout its
                            checkpoints were written in (see `run_guard`);
  builder.lock              the index builder's lock (see `run_guard`);
  checkpoints/<step>/       the trainer's checkpoints, items
                            `retriever_params` (the towers: what the builder
                            embeds with and warm starts read),
                            `reader_params` (not in ICT runs), `train_state`
                            and `data_position`;
  checkpoints/TRAINING_DONE written by the trainer when it ends;
  retriever_snapshots/<step>/
                            the towers alone (item `retriever_params`),
                            saved between checkpoints for the builder
                            (`train.retriever_every`): a refresh cadence at
                            a fraction of a checkpoint's bytes;
  index/<step>/             the published indexes, `step` being the trainer
                            step whose parameters embedded the corpus: items
                            `embeddings`, `metadata` and, for ScaNN, `scann`;
  index/REQUESTED           the index step a trainer waits for (see
                            `client.IndexClient.lockstep_interval`);
  */pruned/                 steps a writer pruned, being deleted;
  */corrupt/                steps a reader refused as damaged (a file
                            truncated or unreadable, a commit marker gone),
                            set aside whole for a person to look at.

Orbax writes each step into a temporary directory and renames it when
complete, so a reader never sees a partial step. Each writer prunes its old
steps while the other job reads them: every reader lists and restores through
`reload`, `restore` and `newest` here, which skip a step that vanishes
meanwhile (`None` instead of its contents, one line in the log) so that the
reader looks again on its next poll. Writers prune by renaming a step into
TRASH (atomic on a local disk; Orbax's `todelete_subdir`) and empty it later,
so a step still in place after a read was whole during it.

Orbax marks each finished step and item with a commit file but, on a local
disk, reads a step without one; `restore` refuses such a step, and one whose
files fail to read, with `DamagedStepError` naming the file, so that no reader
uses half a step left by a crash or a damaged disk.
"""

import dataclasses
import json
import logging
import os
import re
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import checksums
from realm_jax.errors import (BadInput, ChecksumMismatch, DamagedStepError,
                              NotFound)

CONFIG = 'config.gin'
# What the trainer records of a run beside its config (see the layout above).
RECORD = 'run.json'
# The wordpiece vocabulary the run was trained with: its ids mean nothing
# read with another (`step_inputs.check_trained_vocabulary`).
VOCABULARY = 'vocabulary.json'
# The layout a run's checkpoints were written in (`run_guard` checks it).
FORMAT_FILE = 'run_format.json'
# What a run directory written before run_format.json existed holds.
FIRST_FORMAT = {'format': 1, 'checkpoint_items': [
    'data_position', 'reader_params', 'retriever_params', 'train_state']}
# The last format whose checkpoints hold each BERT's layers unrolled: their
# parameters are stacked when read (`restore_params`); a trainer refuses to
# resume them (the optimizer state too is laid out per layer).
UNROLLED_LAYERS_FORMAT = 1
CHECKPOINTS = 'checkpoints'
SNAPSHOTS = 'retriever_snapshots'
INDEX = 'index'
DONE_MARKER = 'TRAINING_DONE'
INDEX_REQUEST = 'REQUESTED'
TRASH = 'pruned'
DAMAGED = 'corrupt'
# Orbax's mark of a finished step, and of each finished item in it; and the
# step's own metadata (its commit time).
COMMIT_FILE = 'commit_success.txt'
STEP_METADATA = '_CHECKPOINT_METADATA'

# Items of a checkpoint step.
TRAIN_STATE = 'train_state'
DATA_POSITION = 'data_position'
# Items of an index step.
EMBEDDINGS = 'embeddings'
METADATA = 'metadata'
SCANN = 'scann'

# Listings retried at once when a step vanishes under one: the writer's
# rename is over by then, so the next listing is clean.
LISTING_ATTEMPTS = 5


# The handlers of every item realm-jax saves: Orbax's, each also writing the
# item's checksums.json (`checksums`) before Orbax commits it. Every manager
# saves and restores through these args, so that whichever manager reads a
# step, Orbax finds the one handler of each item.
StandardHandler = checksums.checksummed(ocp.StandardCheckpointHandler)
JsonHandler = checksums.checksummed(ocp.JsonCheckpointHandler)


@ocp.args.register_with_handler(StandardHandler, for_save=True)
@dataclasses.dataclass
class StandardSave(ocp.args.StandardSave):
  pass


@ocp.args.register_with_handler(StandardHandler, for_restore=True)
@dataclasses.dataclass
class StandardRestore(ocp.args.StandardRestore):
  pass


@ocp.args.register_with_handler(JsonHandler, for_save=True)
@dataclasses.dataclass
class JsonSave(ocp.args.JsonSave):
  pass


@ocp.args.register_with_handler(JsonHandler, for_restore=True)
@dataclasses.dataclass
class JsonRestore(ocp.args.JsonRestore):
  pass


def params_item(name: str) -> str:
  """The checkpoint item of one top-level parameter tree ('retriever',
  'reader')."""
  return f'{name}_params'


RETRIEVER_ITEM = params_item('retriever')


def absolute(model_dir: str) -> str:
  """A local model_dir made absolute (Orbax needs that); URLs as they are."""
  return model_dir if '://' in model_dir else os.path.abspath(model_dir)


def config_path(model_dir: str) -> epath.Path:
  return epath.Path(model_dir) / CONFIG


def vocabulary_path(model_dir: str) -> epath.Path:
  return epath.Path(model_dir) / VOCABULARY


def record_path(model_dir: str) -> epath.Path:
  return epath.Path(model_dir) / RECORD


def replace_whole(path: epath.Path, text: str) -> None:
  """Writes `text` to a temporary file renamed over `path`: a reader in
  another process sees the old file or the new one, never half of one."""
  partial = path.parent / f'.{path.name}.{os.getpid()}'
  partial.write_text(text)
  partial.replace(path)


def write_record(model_dir: str, record: dict) -> None:
  """Writes the run's `RECORD` (process 0: the processes share it)."""
  if not jax.process_index():
    replace_whole(record_path(model_dir),
                  json.dumps(record, indent=2, sort_keys=True) + '\n')


def read_record(model_dir: str) -> dict | None:
  """The run's `RECORD`; None where its trainer has not written one (yet,
  or ever: runs trained before it was written have none)."""
  path = record_path(model_dir)
  try:
    record = json.loads(path.read_text())
  except FileNotFoundError:
    return None
  except ValueError as error:  # UnicodeDecodeError is one too.
    raise BadInput(f'{path} is damaged ({error}); a trainer started on the '
                   'run writes it again.') from error
  if not isinstance(record, dict):
    raise BadInput(f'{path} is damaged (not a JSON object); a trainer '
                   'started on the run writes it again.')
  return record


def checkpoints_dir(model_dir: str) -> str:
  return os.path.join(absolute(model_dir), CHECKPOINTS)


def snapshots_dir(model_dir: str) -> str:
  return os.path.join(absolute(model_dir), SNAPSHOTS)


def index_dir(model_dir: str) -> str:
  return os.path.join(absolute(model_dir), INDEX)


def mark_training_done(model_dir: str) -> None:
  path = epath.Path(checkpoints_dir(model_dir))
  path.mkdir(parents=True, exist_ok=True)
  (path / DONE_MARKER).write_text('done\n')


def clear_training_done(model_dir: str) -> None:
  (epath.Path(checkpoints_dir(model_dir)) / DONE_MARKER).unlink(missing_ok=True)


def training_done(model_dir: str) -> bool:
  return (epath.Path(checkpoints_dir(model_dir)) / DONE_MARKER).exists()


def request_index(model_dir: str, step: int) -> None:
  """Asks the index builder to embed checkpoint `step` next (process 0
  writes; the file is replaced whole, never seen half-written)."""
  if jax.process_index():
    return
  directory = epath.Path(index_dir(model_dir))
  directory.mkdir(parents=True, exist_ok=True)
  replace_whole(directory / INDEX_REQUEST, f'{step}\n')


def requested_index(model_dir: str) -> int | None:
  """The index step a trainer waits for, if any."""
  try:
    return int((epath.Path(index_dir(model_dir)) / INDEX_REQUEST).read_text())
  except (FileNotFoundError, ValueError):
    return None


def clear_index_request(model_dir: str, step: int) -> None:
  """Withdraws the request for `step` once it is served."""
  if not jax.process_index() and requested_index(model_dir) == step:
    (epath.Path(index_dir(model_dir)) / INDEX_REQUEST).unlink(missing_ok=True)


def every_process() -> ocp.options.MultiprocessingOptions:
  """All processes, named: Orbax then syncs them through the distributed
  runtime's keyed barriers rather than device collectives, which its
  background save threads and the main thread would interleave. (Orbax
  then leaves creating the directory to us: see `writable`.)"""
  return ocp.options.MultiprocessingOptions(
      active_processes=set(range(jax.process_count())))


def this_process() -> ocp.options.MultiprocessingOptions:
  """This process alone: a reader of indexes that no other process waits
  for (each trainer process refreshes its own searcher when it looks)."""
  return ocp.options.MultiprocessingOptions(
      primary_host=jax.process_index(),
      active_processes={jax.process_index()})


def writable(directory: str) -> str:
  epath.Path(directory).mkdir(parents=True, exist_ok=True)
  return directory


def settled(manager: ocp.CheckpointManager) -> ocp.CheckpointManager:
  """`manager` once its clean-up of a killed save's temporary directories
  is over. Orbax runs it in a thread of its own that it awaits at the next
  save but not at `close`: a process that ends before saving (a user
  error) would end under it, and it would print a traceback."""
  wait = getattr(manager, '_maybe_await_cleanup_tmp_directory', None)
  if wait is not None:  # Orbax versions without it have no such thread.
    wait()
  return manager


def reader_options(**options) -> ocp.CheckpointManagerOptions:
  """A reader's manager options: read-only, and no commit times read when it
  is made (a step pruned meanwhile would fail that; `reload` reads them)."""
  return ocp.CheckpointManagerOptions(read_only=True, create=False,
                                      lightweight_initialize=True, **options)


def pruning_options(**options) -> ocp.CheckpointManagerOptions:
  """A writer's manager options: pruned steps are first renamed into TRASH,
  and, as for readers, no commit times read when it is made (another writer
  may prune the same directory); `options`: the rest, e.g. max_to_keep."""
  return ocp.CheckpointManagerOptions(todelete_subdir=TRASH,
                                      lightweight_initialize=True, **options)


def _where(manager: ocp.CheckpointManager, step) -> epath.Path:
  return epath.Path(manager.directory) / str(step)


def check_committed(step_dir, items=None) -> None:
  """Raises DamagedStepError unless the step and its `items` (default all
  of them) carry Orbax's commit file, the step's own metadata reads, and
  each item's files match the CRC-32C saved with them (`checksums`)."""
  step_dir = epath.Path(step_dir)
  names = items if items is not None else [
      p.name for p in step_dir.iterdir() if p.is_dir()]
  for where in [step_dir, *(step_dir / name for name in names)]:
    if not (where / COMMIT_FILE).exists():
      raise DamagedStepError(step_dir, where / COMMIT_FILE, 'missing (the '
                             'write that made it did not finish)')
  own = step_dir / STEP_METADATA
  if own.exists():
    try:
      if not isinstance(json.loads(own.read_text()), dict):
        raise ValueError('not a JSON object')
    except ValueError as error:  # UnicodeDecodeError is one too.
      raise DamagedStepError(step_dir, own, str(error)) from error
  for name in names:
    try:
      checksums.verify(step_dir / name)
    except ChecksumMismatch as error:
      raise DamagedStepError(step_dir, error.file, error.problem) from error


def _damaged_file(step_dir: epath.Path, items) -> epath.Path:
  """The file to name for a read that failed without naming one: an item's
  only file, else the item, else the step."""
  if len(items) != 1:
    return step_dir
  item = step_dir / items[0]
  files = [p for p in item.iterdir() if p.name != COMMIT_FILE] \
      if item.is_dir() else []
  return files[0] if len(files) == 1 else item


def set_aside(directory, step: int) -> str | None:
  """Moves a damaged step into `directory`/DAMAGED, out of every reader's
  and writer's sight (its writer may then write the step again); returns
  where it went, None if another reader moved it first."""
  damaged = epath.Path(directory) / DAMAGED
  damaged.mkdir(parents=True, exist_ok=True)
  target = damaged / f'{step}-{time.time_ns()}'
  try:
    (epath.Path(directory) / str(step)).rename(target)
  except FileNotFoundError:
    return None
  logging.error('Set step %d of %s aside as %s.', step, directory, target)
  return str(target)


def reload(manager: ocp.CheckpointManager) -> list[int]:
  """Re-reads the steps of `manager`'s directory; returns them sorted.

  Orbax lists the step directories, then reads each one's commit time: a
  step pruned in between raises FileNotFoundError (or NotADirectoryError).
  That listing is retried; should every attempt meet a vanishing step, the
  previous view stays.
  """
  _reread(manager)
  return sorted(manager.all_steps())


def _reread(manager: ocp.CheckpointManager) -> bool:
  """`reload`'s re-read; False when every attempt met a vanishing step."""
  for _ in range(LISTING_ATTEMPTS):
    try:
      manager.reload()
      return True
    except (FileNotFoundError, NotADirectoryError) as error:
      logging.warning('A step of %s vanished while it was listed (%s: '
                      'pruned by its writer); listing again.',
                      manager.directory, error.filename or error)
  return False


def _entries(directory) -> frozenset[str] | None:
  """The names in a local directory; None for a URL or a missing one."""
  if '://' in str(directory):
    return None
  try:
    return frozenset(path.name for path in epath.Path(directory).iterdir())
  except (FileNotFoundError, NotADirectoryError):
    return None


class Listing:
  """The steps of a read-only manager's directory, re-read only when the
  directory's entries changed since the last read.

  Orbax's re-read opens every step's metadata from a pool of threads it
  starts each time: about 40 ms on 2 busy cores, where a trainer looks for
  a new index before every step and the index builder polls twice a
  second. On a local disk every change a reader can see changes an entry:
  a step is finalized by renaming its temporary directory, pruned or set
  aside by removing or renaming it. In a bucket Orbax marks a finished
  step by a file inside it, so there every look re-reads.
  """

  def __init__(self, manager: ocp.CheckpointManager):
    self.manager = manager
    self._seen = None  # The entries of the last whole re-read.

  def steps(self) -> list[int]:
    """The directory's finalized steps, sorted (as `reload`)."""
    # Listed before the re-read: a change in between is re-read next time.
    entries = _entries(self.manager.directory)
    if entries is None or entries != self._seen:
      self._seen = entries if _reread(self.manager) else None
    return sorted(self.manager.all_steps())


def restore(manager: ocp.CheckpointManager, step: int, args):
  """`manager.restore(step, args)`, or None when the step vanished before or
  during the read. A step still in place that lacks a commit file, or whose
  files fail to read, raises DamagedStepError."""
  where = _where(manager, step)
  try:
    check_committed(where, list(args.keys()))
    restored = manager.restore(step, args=args)
  except Exception as error:  # pylint: disable=broad-except
    if not where.is_dir():
      restored = None
    elif isinstance(error, DamagedStepError):
      raise
    else:
      named = getattr(error, 'filename', None) or _damaged_file(
          where, list(args.keys()))
      raise DamagedStepError(where, named, f'{type(error).__name__}: '
                             f'{error}') from error
  if not _where(manager, step).is_dir():
    logging.warning('Step %d of %s vanished while it was read (pruned by its '
                    'writer); skipped until the next look.', step,
                    manager.directory)
    return None
  return restored


def newest(manager: ocp.CheckpointManager, read, attempts: int = 3):
  """(step, read(step)) of the newest step, looking again when it is pruned
  under the read (a reader lagging a writer that keeps saving); (None, None)
  without steps. `read` returns None for a vanished step (see `restore`)."""
  for _ in range(attempts):
    kept = reload(manager)
    if not kept:
      return None, None
    result = read(kept[-1])
    if result is not None:
      return kept[-1], result
  raise FileNotFoundError(
      f'The newest step of {manager.directory} was pruned {attempts} times '
      'while it was read; its writer prunes faster than it can be read.')


def empty_trash(directory) -> None:
  """Deletes the steps a writer pruned into `directory`/TRASH (process 0
  only: processes share the directory)."""
  trash = epath.Path(directory) / TRASH
  if jax.process_index() or not trash.is_dir():
    return
  for pruned in trash.iterdir():
    try:
      pruned.rmtree()
    except FileNotFoundError:
      pass  # Emptied by an earlier call still running (another thread).


def trainer_checkpoints(model_dir: str) -> ocp.CheckpointManager:
  """Read-only view of the trainer's checkpoints (`reload` to see new
  ones)."""
  return ocp.CheckpointManager(
      checkpoints_dir(model_dir), options=reader_options(
          multiprocessing_options=every_process()))


def _stacked_layers(tree):
  """`tree` with every BERT in it (a dict holding `layer_0`, `layer_1`,
  ...) in the scanned layout of models/bert.py (`bert.stack_layers`): the
  layers' leaves stacked on a new leading axis under 'layers'."""
  if not isinstance(tree, dict):
    return tree
  count = 0
  while f'layer_{count}' in tree:
    count += 1
  if count:
    layers = [tree[f'layer_{i}'] for i in range(count)]
    tree = {k: v for k, v in tree.items()
            if not re.fullmatch(r'layer_\d+', k)}
    tree['layers'] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  return {k: _stacked_layers(v) for k, v in tree.items()}


def _unstacked_layers(tree: dict) -> dict:
  """One level of `_stacked_layers` undone: 'layers' split into `layer_i`."""
  stacked = tree['layers']
  count = jax.tree.leaves(stacked)[0].shape[0]
  tree = {k: v for k, v in tree.items() if k != 'layers'}
  for i in range(count):
    tree[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return tree


def in_layout_of(tree, like):
  """`tree` with each BERT in it laid out as in `like` (the parameters a
  model builds): stacked under 'layers' where `like` scans, `layer_0` ...
  where it does not. A warm start's source run may have been trained with
  the other `BertConfig.scan_layers`."""
  if not isinstance(tree, dict) or not isinstance(like, dict):
    return tree
  if 'layers' in like and 'layer_0' in tree:
    tree = _stacked_layers(tree)
  elif 'layer_0' in like and 'layers' in tree:
    tree = _unstacked_layers(tree)
  return {k: in_layout_of(v, like.get(k)) for k, v in tree.items()}


def has_checkpoints(model_dir: str) -> bool:
  directory = epath.Path(checkpoints_dir(model_dir))
  return directory.is_dir() and any(
      p.name.isdigit() for p in directory.iterdir())


def recorded_format(model_dir: str) -> int | None:
  """The format version a run directory's checkpoints were written in: its
  format file's, `FIRST_FORMAT`'s when it has checkpoints but no file, None
  when it has neither (or the file is unreadable)."""
  path = epath.Path(model_dir) / FORMAT_FILE
  try:
    return int(json.loads(path.read_text())['format'])
  except FileNotFoundError:
    return FIRST_FORMAT['format'] if has_checkpoints(model_dir) else None
  except (ValueError, KeyError, TypeError):
    return None


def _in_current_layout(model_dir: str, params):
  """Parameters restored from `model_dir` as this code lays them out: a run
  written before the layers were scanned (format 1) has each BERT's layers
  unrolled, `layer_0` ...; they are stacked under 'layers'."""
  if (params is None
      or recorded_format(model_dir) != UNROLLED_LAYERS_FORMAT):
    return params
  return _stacked_layers(params)


def restore_retriever_params(checkpoints: ocp.CheckpointManager, step: int):
  """Only the towers' parameters of a trainer step (not reader or optimizer);
  None if the trainer pruned the step meanwhile."""
  restored = restore(checkpoints, step, ocp.args.Composite(**{
      RETRIEVER_ITEM: StandardRestore()}))
  return None if restored is None else _in_current_layout(
      str(epath.Path(checkpoints.directory).parent),
      restored[RETRIEVER_ITEM])


class RetrieverSteps:
  """Every step whose towers a run keeps, for the index builder: its
  checkpoints and its retriever snapshots, read-only (`reload` to see new
  ones). A step both hold is read from the checkpoint."""

  def __init__(self, model_dir: str):
    self.model_dir = model_dir
    self._checkpoints = Listing(trainer_checkpoints(model_dir))
    self._snapshots = None  # Made once the trainer has written one.
    self._holder = {}

  def _listings(self) -> list[Listing]:
    if self._snapshots is None and epath.Path(
        snapshots_dir(self.model_dir)).is_dir():
      self._snapshots = Listing(ocp.CheckpointManager(
          snapshots_dir(self.model_dir), options=reader_options(
              multiprocessing_options=every_process())))
    return [listing for listing in (self._snapshots, self._checkpoints)
            if listing is not None]

  def reload(self) -> list[int]:
    """Re-lists both directories (where they changed); the steps, sorted."""
    self._holder = {step: listing.manager for listing in self._listings()
                    for step in listing.steps()}
    return sorted(self._holder)

  def where(self, step: int) -> str:
    """The directory of `step` (as of the last `reload`)."""
    return str(_where(self._holder[step], step))

  def restore(self, step: int):
    """The towers' parameters of `step` (see `restore_retriever_params`);
    None if it is not kept, or was pruned meanwhile."""
    if step not in self._holder:
      return None
    return restore_retriever_params(self._holder[step], step)


def restore_params(model_dir: str, step: int | None = None,
                   towers=('retriever', 'reader')) -> tuple[int, dict]:
  """(step, {'retriever': ..., 'reader': ...}) of a run's checkpoint `step`
  (default the newest), for warm starts and evaluation; of `towers` alone,
  and 'reader' only if the run had one. The run may still be training and
  pruning its checkpoints. A run written with each BERT's layers unrolled
  (format 1) is read with them stacked, as this code builds them."""
  manager = trainer_checkpoints(model_dir)

  def read(step):
    names = [name for name in towers if (
        epath.Path(manager.directory) / str(step) / params_item(name)
    ).is_dir()]
    restored = restore(manager, step, ocp.args.Composite(**{
        params_item(n): StandardRestore() for n in names}))
    return None if restored is None else _in_current_layout(model_dir, {
        n: jax.device_get(restored[params_item(n)]) for n in names})

  if step is None:
    step, params = newest(manager, read)
    if step is None:
      raise NotFound(f'No checkpoint under {checkpoints_dir(model_dir)}.',
                     'Train the run first (`realm-jax train`).')
    return step, params
  kept = reload(manager)
  params = read(step) if step in kept else None
  if params is None:
    raise NotFound(f'No checkpoint {step} under {checkpoints_dir(model_dir)}; '
                   f'kept: {reload(manager)}.')
  return step, params
