"""CRC-32C of every file a run keeps, written with it, checked when it is read.

Orbax and TensorStore keep no checksums of array bytes, and a memory-mapped
.npy file is read as it is: a flipped bit in a checkpoint, an index or a
block store would be served as if it were right. So each directory realm-jax
writes whole (a checkpoint's or an index's item, a block store, a task's
exported arrays) gets `checksums.json`, the CRC-32C of each of its files,
written before the directory becomes visible: for Orbax items by their
handler's `finalize` (`checksummed`), which runs before Orbax commits the
step; for the .npy stores into the staged directory before it is renamed.
Readers call `verify` on what they are about to read.

A directory without `checksums.json` was written before realm-jax kept them
and is read unchecked (logged once per directory).

CRC-32C (Castagnoli), as TensorFlow's and GCS's files carry, through
google-crc32c's compiled code: about 10 GB/s a core, so a check costs a
fraction of the read it guards.
"""

import json
import logging
import os
import threading

import google_crc32c
from etils import epath

from realm_jax import errors

log = logging.getLogger(__name__)

MANIFEST = 'checksums.json'
# Files Orbax writes after `finalize`, when it commits: not covered.
_AFTER_FINALIZE = ('commit_success.txt',)
# Small enough that each read reuses the memory of the one before: 16 MiB
# reads ran at a quarter of the rate, paging in fresh memory each time.
_CHUNK = 256 << 10
_unchecked_logged = set()
_unchecked_lock = threading.Lock()


def extend(crc: int, chunk: bytes) -> int:
  """The CRC-32C of the bytes before and `chunk`, from theirs (`crc`; 0
  before any): TFRecord framing and TensorFlow checkpoints use it too."""
  return google_crc32c.extend(crc, chunk)


def masked(crc: int) -> int:
  """`crc` as TFRecord framing and TensorFlow checkpoints store it: rotated
  and offset, as LevelDB does, so that the CRC of bytes holding CRCs stays
  informative."""
  return ((crc >> 15 | crc << 17) + 0xa282ead8) & 0xffffffff


def crc32c(path) -> int:
  """The CRC-32C of a file's bytes, read a chunk at a time."""
  crc = 0
  with epath.Path(path).open('rb') as f:
    for chunk in iter(lambda: f.read(_CHUNK), b''):
      crc = extend(crc, chunk)
  return crc


def _files(directory: epath.Path) -> list[str]:
  """Every file under `directory`, by its path relative to it."""
  found, folders = [], [directory]
  while folders:  # epath globs no `**` (thousands of listings on GCS).
    for path in folders.pop().iterdir():
      if path.is_dir():
        folders.append(path)
      elif path.name not in (MANIFEST, *_AFTER_FINALIZE):
        found.append(os.fspath(path.relative_to(directory)))
  return sorted(found)


def write(directory) -> None:
  """`directory`/checksums.json: the CRC-32C of each file under it (written
  to a temporary name and renamed, so it is whole or absent)."""
  directory = epath.Path(directory)
  manifest = {'algorithm': 'crc32c', 'files': {
      name: f'{crc32c(directory / name):08x}' for name in _files(directory)}}
  partial = directory / f'.{MANIFEST}.{os.getpid()}'
  partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
  partial.replace(directory / MANIFEST)


def verify(directory) -> None:
  """Checks every file `directory`/checksums.json names against its CRC-32C;
  raises errors.ChecksumMismatch naming the first that differs, is missing,
  or the manifest itself when it does not read."""
  directory = epath.Path(directory)
  path = directory / MANIFEST
  try:
    text = path.read_text()
  except FileNotFoundError:
    _log_unchecked(directory)
    return
  except (OSError, UnicodeDecodeError) as error:
    raise errors.ChecksumMismatch(path, f'unreadable ({error})') from error
  try:
    files = json.loads(text)['files']
    expected = {str(name): int(crc, 16) for name, crc in files.items()}
  except (ValueError, KeyError, TypeError, AttributeError) as error:
    raise errors.ChecksumMismatch(
        path, f'not a checksum manifest ({type(error).__name__}: {error})'
    ) from error
  for name, crc in expected.items():
    file = directory / name
    try:
      found = crc32c(file)
    except FileNotFoundError as error:
      raise errors.ChecksumMismatch(
          file, f'missing, though {MANIFEST} lists it') from error
    if found != crc:
      raise errors.ChecksumMismatch(
          file, f'CRC-32C {found:08x}, but {MANIFEST} says {crc:08x}: its '
          'bytes changed after it was written (a flipped bit, a damaged '
          'disk)')


def _log_unchecked(directory: epath.Path) -> None:
  with _unchecked_lock:
    if directory in _unchecked_logged:
      return
    _unchecked_logged.add(directory)
  log.info('%s has no %s (written before realm-jax kept checksums); read '
           'unchecked.', directory, MANIFEST)


def checksummed(handler_class: type) -> type:
  """A subclass of the Orbax handler `handler_class` whose `finalize` also
  writes the item's checksums.json, on the primary process (the item's
  files are all written by then; Orbax commits the item after)."""

  class Checksummed(handler_class):

    def finalize(self, directory: epath.Path) -> None:
      super().finalize(directory)
      # Imported here: the arrays' and block store's readers import this
      # module ahead of TensorFlow in `eval`, and TensorFlow loaded after
      # JAX prints its CUDA probe's ERROR line past TF_CPP_MIN_LOG_LEVEL.
      import jax  # pylint: disable=g-import-not-at-top
      if jax.process_index() == 0:
        write(directory)

  Checksummed.__name__ = Checksummed.__qualname__ = (
      f'Checksummed{handler_class.__name__}')
  return Checksummed
