"""CRC-32C of every file a run keeps, written with it, checked when it is read.

Orbax and TensorStore keep no checksums of array bytes, and a memory-mapped
.npy file is read as it is: a flipped bit in a checkpoint, an index or a
block store would be served as if it were right. So each directory realm-jax
writes whole (a checkpoint's or an index's item, a block store, a task's
exported arrays) gets `checksums.json`, the CRC-32C of each of its files,
written before the directory becomes visible: for Orbax items by their
handler's `finalize` (`checksummed`), which runs before Orbax commits the
step; for the .npy stores into the staged directory before it is renamed.
Readers call `verify` on what they are about to read. A block store also
gets the CRC-32C of each PIECE bytes of its files: a reader of some of
its blocks (those `ask` shows, an index builder's share, those a corpus
sync adds) memory-maps it, and `Pieces` checks the pieces a read touches,
the first time it touches them, rather than every byte at open
(gigabytes, for the paper's 13M blocks).

A directory without `checksums.json` was written before realm-jax kept them
and is read unchecked (logged once per directory).

CRC-32C (Castagnoli), as TensorFlow's and GCS's files carry, through
google-crc32c's compiled code: about 10 GB/s a core, so a check costs a
fraction of the read it guards.
"""

import hashlib
import json
import logging
import os
import threading

import google_crc32c
import numpy as np
from etils import epath

from realm_jax import errors

log = logging.getLogger(__name__)

MANIFEST = 'checksums.json'
# Files Orbax writes after `finalize`, when it commits: not covered.
_AFTER_FINALIZE = ('commit_success.txt',)
# Small enough that each read reuses the memory of the one before: 16 MiB
# reads ran at a quarter of the rate, paging in fresh memory each time.
_CHUNK = 256 << 10
# The bytes each piece checksum covers: a read of one block checks 64 KiB
# of a file, about 4 us, and a 13M-block store's manifest holds 150k.
PIECE = 64 << 10
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


def _piece_crcs(path) -> tuple[int, str]:
  """(the file's CRC-32C, that of each PIECE bytes of it as 8 hex digits
  each, in order)."""
  crc, pieces = 0, []
  with epath.Path(path).open('rb') as f:
    for piece in iter(lambda: f.read(PIECE), b''):
      crc = extend(crc, piece)
      pieces.append(f'{extend(0, piece):08x}')
  return crc, ''.join(pieces)


def write(directory, pieces: bool = False) -> None:
  """`directory`/checksums.json: the CRC-32C of each file under it, and
  with `pieces` of each PIECE bytes of them (written to a temporary name
  and renamed, so it is whole or absent)."""
  directory = epath.Path(directory)
  manifest = {'algorithm': 'crc32c', 'files': {}}
  if pieces:
    manifest['piece_bytes'], manifest['pieces'] = PIECE, {}
  for name in _files(directory):
    if pieces:
      crc, manifest['pieces'][name] = _piece_crcs(directory / name)
    else:
      crc = crc32c(directory / name)
    manifest['files'][name] = f'{crc:08x}'
  partial = directory / f'.{MANIFEST}.{os.getpid()}'
  partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
  partial.replace(directory / MANIFEST)


def _manifest(directory: epath.Path) -> dict | None:
  """`directory`'s checksums.json, None where it has none; raises
  errors.ChecksumMismatch when it does not read."""
  path = directory / MANIFEST
  try:
    text = path.read_text()
  except FileNotFoundError:
    _log_unchecked(directory)
    return None
  except (OSError, UnicodeDecodeError) as error:
    raise errors.ChecksumMismatch(path, f'unreadable ({error})') from error
  try:
    manifest = json.loads(text)
    manifest['files'] = {str(name): int(crc, 16)
                         for name, crc in manifest['files'].items()}
    if 'pieces' in manifest:
      manifest['piece_bytes'] = int(manifest['piece_bytes'])
      manifest['pieces'] = {
          str(name): np.frombuffer(bytes.fromhex(crcs), '>u4')
          for name, crcs in manifest['pieces'].items()}
  except (ValueError, KeyError, TypeError, AttributeError) as error:
    raise errors.ChecksumMismatch(
        path, f'not a checksum manifest ({type(error).__name__}: {error})'
    ) from error
  return manifest


def _changed(file: epath.Path, found: int, expected: int,
             what: str = '') -> errors.ChecksumMismatch:
  return errors.ChecksumMismatch(
      file, f'CRC-32C {found:08x}{what}, but {MANIFEST} says {expected:08x}: '
      'its bytes changed after it was written (a flipped bit, a damaged '
      'disk)')


def verify(directory) -> None:
  """Checks every file `directory`/checksums.json names against its CRC-32C;
  raises errors.ChecksumMismatch naming the first that differs, is missing,
  or the manifest itself when it does not read."""
  directory = epath.Path(directory)
  manifest = _manifest(directory)
  if manifest is None:
    return
  for name, crc in manifest['files'].items():
    file = directory / name
    try:
      found = crc32c(file)
    except FileNotFoundError as error:
      raise errors.ChecksumMismatch(
          file, f'missing, though {MANIFEST} lists it') from error
    if found != crc:
      raise _changed(file, found, crc)


class Pieces:
  """A directory's files, checked a piece at a time as reads touch them.

  Opening checks that every file the manifest lists is there, as long as
  its pieces say; `check` then reads each piece of a byte range not
  checked before and compares its CRC-32C, raising
  errors.ChecksumMismatch naming the file and the piece. A piece checked
  once is not read again by this object (so a store's reader pays for a
  piece once, however often it serves it).
  """

  def __init__(self, directory: epath.Path, manifest: dict):
    self.directory = directory
    self._bytes = manifest['piece_bytes']
    self._crcs = manifest['pieces']
    self._checked = {name: np.zeros(len(crcs), bool)
                     for name, crcs in self._crcs.items()}
    self._files = {}
    for name, crcs in self._crcs.items():
      file = directory / name
      try:
        size = file.stat().length
      except FileNotFoundError as error:
        raise errors.ChecksumMismatch(
            file, f'missing, though {MANIFEST} lists it') from error
      if -(-size // self._bytes) != len(crcs):
        raise errors.ChecksumMismatch(
            file, f'{size:,} bytes, but {MANIFEST} has {len(crcs):,} pieces '
            f'of {self._bytes:,}: it was cut short or grew after it was '
            'written')

  def check(self, name: str, start: int, stop: int) -> None:
    """Checks bytes [start, stop) of file `name` (relative to the
    directory); a file the manifest does not list is not checked."""
    checked = self._checked.get(name)
    if checked is None or stop <= start:
      return
    first, last = start // self._bytes, (stop - 1) // self._bytes
    if first == last and checked[first]:
      return  # The common case, a block read again: no array made.
    todo = first + np.flatnonzero(~checked[first:last + 1])
    if not len(todo):
      return
    file = self.directory / name
    if name not in self._files:  # Kept open: a block's read is a few pieces.
      self._files[name] = file.open('rb')
    for piece in todo.tolist():
      self._files[name].seek(piece * self._bytes)
      found = extend(0, self._files[name].read(self._bytes))
      if found != self._crcs[name][piece]:
        raise _changed(file, found, int(self._crcs[name][piece]),
                       f' in bytes {piece * self._bytes:,} to '
                       f'{(piece + 1) * self._bytes:,}')
      checked[piece] = True

  def close(self) -> None:
    for opened in self._files.values():
      opened.close()
    self._files.clear()

  def __del__(self):
    self.close()


def open_pieces(directory) -> Pieces | None:
  """`directory`'s files to check as they are read: a Pieces where its
  manifest has pieces; where it has none (written before realm-jax kept
  them), every file checked whole now and None; None too without a
  manifest (read unchecked, logged once)."""
  directory = epath.Path(directory)
  manifest = _manifest(directory)
  if manifest is None:
    return None
  if 'pieces' not in manifest:
    verify(directory)
    return None
  return Pieces(directory, manifest)


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


def sha256(path) -> str:
  """The hex sha256 of a file's bytes (a manifest's fingerprint), read a
  MiB at a time."""
  digest = hashlib.sha256()
  with epath.Path(path).open('rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()
