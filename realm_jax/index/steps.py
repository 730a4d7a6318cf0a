"""Steps of a run directory whose writer prunes them while others read.

The trainer keeps its newest checkpoints and the index builder its newest
indexes; each deletes older steps while the other job lists or restores them.
Every reader of a run directory lists and restores through here: a step that
vanishes meanwhile is skipped with one line in the log (`None` instead of
its contents), and the reader looks again on its next poll.

Writers prune by renaming a step into `TRASH` (atomic on a local disk; Orbax's
`todelete_subdir`) and empty it later, so a step still in place after a read
was whole during it: nothing reads a partly deleted step.
"""

import logging

import jax
import orbax.checkpoint as ocp
from etils import epath

# Where writers move pruned steps before deleting them.
TRASH = 'pruned'
# Listings retried at once when a step vanishes under one: the writer's
# rename is over by then, so the next listing is clean.
LISTING_ATTEMPTS = 5


def _where(manager: ocp.CheckpointManager, step) -> epath.Path:
  return epath.Path(manager.directory) / str(step)


def reload(manager: ocp.CheckpointManager) -> list[int]:
  """Re-reads the steps of `manager`'s directory; returns them sorted.

  Orbax lists the step directories, then reads each one's commit time: a
  step pruned in between raises FileNotFoundError (or NotADirectoryError).
  That listing is retried; should every attempt meet a vanishing step, the
  previous view stays.
  """
  for _ in range(LISTING_ATTEMPTS):
    try:
      manager.reload()
      break
    except (FileNotFoundError, NotADirectoryError) as error:
      logging.warning('A step of %s vanished while it was listed (%s: '
                      'pruned by its writer); listing again.',
                      manager.directory, error.filename or error)
  return sorted(manager.all_steps())


def restore(manager: ocp.CheckpointManager, step: int, args):
  """`manager.restore(step, args)`, or None when the step vanished before or
  during the read. A read that fails on a step still in place raises."""
  try:
    restored = manager.restore(step, args=args)
  except Exception:  # pylint: disable=broad-except
    if _where(manager, step).is_dir():
      raise
    restored = None
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
