"""Train checkpoints through Orbax: all a run needs to continue exactly.

Each step (model_dir/checkpoints/<step>, see `run_directory`) holds one
`<name>_params` item per parameter tree (the towers, the reader), the
train state (step, optimizer state, rng) and the data position (JSON: task,
seed, global batch and batches consumed). Saves run in the background; Orbax
renames a finished step into place, so a run killed at any moment leaves its
previous checkpoint whole. Old steps are pruned through the trash, so the
index builder never reads half of one. Readers of a finished or running
run's parameters use `run_directory.restore_params`.

A checkpoint is mostly what only a resume needs (the reader, the optimizer's
two moments): the index builder embeds with the towers alone. With
`retriever_every`, the steps between checkpoints that the builder should
embed save only those (model_dir/retriever_snapshots), asynchronously as
well, at a fraction of the bytes, so a refresh cadence of a few steps does
not hold up training.

A step that fails to restore is told apart: one laid out differently from
what this code restores (the code or the config changed) stops the run
(CheckpointMismatch); one with a damaged file, a file whose bytes fail the
CRC-32C saved with them (`checksums`), or no commit marker
(`errors.DamagedStepError`) is set aside into checkpoints/corrupt/ by
`restore_newest`, which resumes from the step before. A save that fails on
the disk (full, or any OS error) stops the run naming the last good step
(CheckpointSaveFailed).
"""

import json
import logging
import os
import re

import orbax.checkpoint as ocp
from etils import epath

from realm_jax import distributed, errors, run_directory
from realm_jax.errors import CheckpointMismatch, CheckpointSaveFailed
from realm_jax.run_directory import (DATA_POSITION, RETRIEVER_ITEM,
                                     TRAIN_STATE, JsonRestore, JsonSave,
                                     StandardRestore, StandardSave,
                                     params_item)
from realm_jax.training.train_state import TrainState

log = logging.getLogger(__name__)

# TensorStore's words for a file it could not decode, or that lacks what its
# manifest promised.
_DAMAGE = re.compile(
    r'\b(DATA_LOSS|OUT_OF_RANGE|NOT_FOUND|FAILED_PRECONDITION)\b'
    r'|Error decoding')
_LOCAL_FILE = re.compile(r'local file "([^"]+)"')  # Named by TensorStore.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # TensorStore's errno.
_DIFFERENCES_SHOWN = 5


class Checkpoints:
  """Saves every `save_every` steps, keeps the newest `keep` and, with
  `keep_every`, each multiple of it besides (what is scored after the run,
  along its training); with `retriever_every`, a retriever snapshot at each
  multiple of it that is not a checkpoint step (the newest `keep` kept)."""

  def __init__(self, model_dir: str, save_every: int, keep: int = 3,
               retriever_every: int | None = None,
               keep_every: int | None = None):
    for name, value in (('retriever_every', retriever_every),
                        ('keep_every', keep_every)):
      if value is not None and value < 1:
        raise errors.BadConfig(f'train.{name}={value} must be at least 1 '
                               '(or None).')
    self.directory = run_directory.checkpoints_dir(model_dir)
    self.manager = run_directory.settled(ocp.CheckpointManager(
        run_directory.writable(self.directory),
        options=_writer_options(save_interval_steps=save_every,
                                max_to_keep=keep, keep_period=keep_every)))
    self.retriever_every = retriever_every
    self.snapshots = None if retriever_every is None else (
        run_directory.settled(ocp.CheckpointManager(
            run_directory.writable(run_directory.snapshots_dir(model_dir)),
            options=_writer_options(max_to_keep=keep))))
    # (manager, step) of the save running in the background.
    self._writing = None
    self._closed = False

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def due(self, step: int) -> bool:
    """Whether `save` will save a checkpoint of `step` (without force)."""
    return self.manager.should_save(step)

  def snapshot_due(self, step: int) -> bool:
    """Whether `save` will save only the retriever at `step`: a multiple of
    `retriever_every` that no snapshot holds yet (a run resumed from an
    older checkpoint passes over those it saved before it was stopped)."""
    return (self.snapshots is not None and step % self.retriever_every == 0
            and step > (self.snapshots.latest_step() or -1)
            and not self.due(step))

  def save(self, state: TrainState, step: int, data_position: dict,
           force: bool = False) -> bool:
    """Starts saving `state` (after `step` updates; passed in so that no
    device sync is needed) if the step is due or `force`, or its retriever
    if a snapshot is due; True if either. The previous save, of either kind,
    is finished first (its failure is raised here): two Orbax managers'
    cross-process barriers must not interleave."""
    if force or self.due(step):
      manager = self.manager
      items = {params_item(k): StandardSave(v)
               for k, v in state.params.items()}
      items[TRAIN_STATE] = StandardSave(
          {'step': state.step, 'opt_state': state.opt_state,
           'rng': state.rng})
      items[DATA_POSITION] = JsonSave(data_position)
    elif self.snapshot_due(step):
      manager = self.snapshots
      items = {RETRIEVER_ITEM: StandardSave(
          state.params['retriever'])}
      force = True  # Due by `snapshot_due`, not by the manager's interval.
    else:
      return False
    self._finish_writing()
    try:
      saving = manager.save(step, args=ocp.args.Composite(**items),
                            force=force)
    except Exception as error:  # pylint: disable=broad-except
      _raise_save_failure(manager, step, error)
      raise
    if saving:  # Steps pruned by earlier saves (this one's go at the next).
      self._writing = manager, step
      run_directory.empty_trash(manager.directory)
    return saving

  def restore(self, step: int, abstract: TrainState):
    """(state, data_position) of `step`, placed as `abstract`'s shardings.

    Raises CheckpointMismatch when the step's items or trees differ from
    `abstract`'s (a step missing an item counts: stopping is the safe side),
    and errors.DamagedStepError when one of its files is missing or
    damaged.
    """
    trees = {params_item(k): v for k, v in abstract.params.items()}
    trees[TRAIN_STATE] = {'step': abstract.step,
                          'opt_state': abstract.opt_state, 'rng': abstract.rng}
    items = {k: StandardRestore(v) for k, v in trees.items()}
    items[DATA_POSITION] = JsonRestore()
    where = epath.Path(self.directory) / str(step)
    try:
      run_directory.check_committed(where, list(items))
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # pylint: disable=broad-except
      self._explain_restore_failure(where, trees, error)
      raise
    rest = restored[TRAIN_STATE]
    state = TrainState(
        step=rest['step'], opt_state=rest['opt_state'], rng=rest['rng'],
        params={k: restored[params_item(k)] for k in abstract.params})
    return state, restored[DATA_POSITION]

  def restore_newest(self, abstract: TrainState):
    """(step, state, data_position) of the newest step that reads back
    whole; None without any step.

    A damaged step is logged and passed over for the one before; once one
    reads, the damaged ones are moved into checkpoints/corrupt/ (for
    inspection; nothing deletes them) and their steps are saved anew. When
    every step is damaged none is moved and RuntimeError is raised. A step
    laid out for other code (CheckpointMismatch) stops the run instead:
    passing over it would resume from older code's step, or from scratch.
    """
    damaged = []
    for step in reversed(run_directory.reload(self.manager)):
      try:
        state, position = self.restore(step, abstract)
        whole = True
      except errors.DamagedStepError as error:
        log.error('%s', error)
        whole = False
      if distributed.everyone(whole):
        self._set_aside(damaged, step)
        return step, state, position
      damaged.append(step)
    if damaged:
      raise RuntimeError(
          f'Every checkpoint in {self.directory} is damaged (steps '
          f'{sorted(damaged)}; the errors are logged above); none was moved. '
          'Repair or remove them, or use a new model_dir.')
    return None

  def wait(self) -> None:
    self._finish_writing()
    for manager in self._managers():
      run_directory.empty_trash(manager.directory)

  def close(self) -> None:
    if self._closed:
      return
    self._finish_writing()
    for manager in self._managers():
      manager.close()
      run_directory.empty_trash(manager.directory)
    self._closed = True

  def __enter__(self) -> 'Checkpoints':
    return self

  def __exit__(self, unused_kind, error, unused_traceback) -> None:
    """Closes, on an error too: a save running in the background ends
    before the error is reported, not while the interpreter shuts down
    under it (a second traceback, a temporary directory left behind)."""
    if error is None:
      self.close()
      return
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      log.warning('Closing %s after an error failed too.', self.directory,
                  exc_info=True)

  def _managers(self) -> list[ocp.CheckpointManager]:
    return [m for m in (self.manager, self.snapshots) if m is not None]

  def _finish_writing(self) -> None:
    if self._writing is None:
      return
    manager, step = self._writing
    try:
      manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      _raise_save_failure(manager, step, error)
      raise
    self._writing = None

  def _explain_restore_failure(self, where: epath.Path, trees: dict,
                               error: Exception) -> None:
    """Raises CheckpointMismatch or DamagedStepError for a restore of step
    `where` that failed with `error`; returns when it is neither (or the
    step is gone). The layout is looked at first: a restore into other
    trees, or of other items, can fail in ways that look like damage."""
    if not where.is_dir():
      return
    expected = set(trees) | {DATA_POSITION}
    present = {p.name for p in where.iterdir() if p.is_dir()}
    if present != expected:
      raise CheckpointMismatch(
          f'Checkpoint {where} does not match this code: it holds the items '
          f'{sorted(present)}, this code restores {sorted(expected)}. '
          'Resume with the code and config that saved it, or use a new '
          'model_dir.') from error
    if isinstance(error, errors.DamagedStepError):
      return
    # Named first: a tree read below would fail on it too, under its item.
    unreadable = _unreadable_json(where)
    if unreadable is not None:
      raise errors.DamagedStepError(
          where, unreadable, 'not JSON') from error
    for item, tree in trees.items():
      try:
        differences = _tree_differences(where / item, tree)
      except Exception as unreadable:  # pylint: disable=broad-except
        if not _damage(unreadable):
          return
        raise errors.DamagedStepError(
            where, *_damaged_file(unreadable, where / item)) from error
      if differences:
        raise CheckpointMismatch(
            f'Checkpoint {where} does not match this code: its {item} '
            f'differs from the trees this code and config build '
            f'({"; ".join(differences)}). Resume with the code and config '
            'that saved it, or use a new model_dir.') from error
    if _damage(error):
      raise errors.DamagedStepError(
          where, *_damaged_file(error, where)) from error

  def _set_aside(self, damaged: list[int], resumed: int) -> None:
    """Moves the `damaged` steps into run_directory.DAMAGED (process 0; the
    others wait for it), out of Orbax's listing and the pruning's reach."""
    if not damaged:
      return
    if distributed.process_index() == 0:
      for step in damaged:
        run_directory.set_aside(self.directory, step)
      log.warning('Resuming from checkpoint step %d of %s, the newest whole '
                  'one.', resumed, self.directory)
    distributed.everyone(True)  # Every process lists after the moves.
    run_directory.reload(self.manager)


def _writer_options(**options) -> ocp.CheckpointManagerOptions:
  """A trainer's manager: saves in the background, leaves no temporary
  directory of a killed save behind, prunes through the trash."""
  return run_directory.pruning_options(
      create=False, enable_async_checkpointing=True,
      cleanup_tmp_directories=True,
      multiprocessing_options=run_directory.every_process(), **options)


def _raise_save_failure(manager: ocp.CheckpointManager, step,
                        error: Exception) -> None:
  """Raises CheckpointSaveFailed when `error` came from the OS (a full
  disk, ...): Orbax left the step's temporary directory, which no listing
  shows and the next start deletes; the steps before are whole."""
  code = _os_error_code(error)
  if code is None:
    return
  what = ('retriever snapshot' if os.path.basename(manager.directory)
          == run_directory.SNAPSHOTS else 'checkpoint')
  kept = run_directory.reload(manager)
  last = (f'the last good {what} is step {kept[-1]}.' if kept else
          f'there is no good {what} yet.')
  raise CheckpointSaveFailed(
      f'Saving {what} step {step} to {manager.directory} failed: '
      f'{os.strerror(code)}; {last}', code) from error


def _chain(error: BaseException):
  """`error` and the errors it was raised from or while handling."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _damage(error: Exception) -> bool:
  """Whether `error` says a file could not be read back: missing, cut
  short, or not what its reader decodes."""
  return any(isinstance(e, (FileNotFoundError, UnicodeDecodeError,
                            json.JSONDecodeError))
             or isinstance(e, ValueError) and _DAMAGE.search(str(e))
             for e in _chain(error))


def _damaged_file(error: Exception, where: epath.Path) -> tuple[str, str]:
  """(the damaged file, what is wrong with it), as far as `error` says;
  the file is `where` (a step or an item) when it names none."""
  for e in _chain(error):
    if isinstance(e, FileNotFoundError):
      return (e.filename, 'missing') if e.filename else (str(where), str(e))
    if isinstance(e, (UnicodeDecodeError, json.JSONDecodeError)):
      return str(_unreadable_json(where) or where), f'not JSON ({e})'
    if isinstance(e, ValueError) and _DAMAGE.search(str(e)):
      # TensorStore names the file; the spec that follows is long.
      problem = str(e).split(' [tensorstore_spec')[0]
      files = _LOCAL_FILE.findall(problem)
      return (files[-1] if files else str(where)), problem
  return str(where), str(error)


def _unreadable_json(where: epath.Path) -> epath.Path | None:
  """The first of the JSON files Orbax reads back in step or item `where`
  that does not decode."""
  for item in ('', '*/'):
    for name in ('_METADATA', 'array_metadatas/*', 'metadata'):
      for path in sorted(where.glob(item + name)):
        try:
          json.loads(path.read_text())
        except ValueError:
          return path
  return None


def _tree_differences(item: epath.Path, tree) -> list[str]:
  """How the tree saved in `item` differs from `tree` (its leaves' names and
  shapes; dtypes are cast on restore); a few lines, empty when alike."""
  handler = ocp.StandardCheckpointHandler()
  try:
    saved = _leaves(handler.metadata(item).tree)
  finally:
    handler.close()
  wanted = _leaves(ocp.tree.serialize_tree(tree))
  differences = (
      [f'{n} is not in the checkpoint' for n in sorted(wanted.keys() - saved)]
      + [f'{n} is in the checkpoint only'
         for n in sorted(saved.keys() - wanted)]
      + [f'{n} has shape {saved[n]} there, {wanted[n]} here'
         for n in sorted(saved.keys() & wanted) if saved[n] != wanted[n]])
  if len(differences) > _DIFFERENCES_SHOWN:
    differences[_DIFFERENCES_SHOWN:] = [
        f'{len(differences) - _DIFFERENCES_SHOWN} more']
  return differences


def _leaves(tree) -> dict:
  """'a.b.c' -> shape of each leaf of `tree`."""
  return {'.'.join(map(str, path)): tuple(getattr(leaf, 'shape', ()))
          for path, leaf in ocp.tree.to_flat_dict(tree).items()}


def _os_error_code(error: Exception) -> int | None:
  """The errno of the OS error behind `error` (an OSError of a Python
  write, or TensorStore's error text); None when none is."""
  for e in _chain(error):
    if isinstance(e, OSError) and e.errno:
      return e.errno
    code = _OS_ERROR_CODE.search(str(e))
    if code:
      return int(code.group(1))
  return None
