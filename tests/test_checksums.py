"""CRC-32C manifests: every change to a file's bytes is named, nothing else
is refused."""

import json
import os

import numpy as np
import pytest

from realm_jax import checksums, errors
from tests.helpers import flip_a_bit

pytestmark = pytest.mark.unit


@pytest.fixture
def written(tmp_path):
  """A directory of two files, one in a sub-directory, with its manifest."""
  rng = np.random.default_rng(0)
  (tmp_path / 'sub').mkdir()
  (tmp_path / 'a.npy').write_bytes(rng.bytes(64))
  (tmp_path / 'sub' / 'b').write_bytes(rng.bytes(1000))
  checksums.write(tmp_path)
  return tmp_path


def test_crc32c_is_castagnolis(tmp_path):
  """The check value of CRC-32C (RFC 3720, B.4), whole or extended."""
  (tmp_path / 'check').write_bytes(b'123456789')
  assert checksums.crc32c(tmp_path / 'check') == 0xe3069283
  assert checksums.extend(checksums.extend(0, b'1234'), b'56789') == (
      0xe3069283)
  (tmp_path / 'empty').write_bytes(b'')
  assert checksums.crc32c(tmp_path / 'empty') == 0


def test_a_whole_directory_verifies(written):
  manifest = json.loads((written / checksums.MANIFEST).read_text())
  assert sorted(manifest['files']) == ['a.npy', 'sub/b']
  checksums.verify(written)


def test_every_single_bit_flip_is_named(written):
  path = written / 'a.npy'
  original = path.read_bytes()
  for position in range(len(original) * 8):
    flipped = bytearray(original)
    flipped[position // 8] ^= 1 << position % 8
    path.write_bytes(bytes(flipped))
    with pytest.raises(errors.ChecksumMismatch) as refused:
      checksums.verify(written)
    assert refused.value.file == str(path)
    assert 'but checksums.json says' in str(refused.value)
  path.write_bytes(original)
  checksums.verify(written)


def test_a_flip_deep_in_a_large_file_is_named(written):
  path = written / 'sub' / 'b'
  path.write_bytes(np.random.default_rng(1).bytes(40 << 20))
  checksums.write(written)
  flip_a_bit(path, seed=3)
  with pytest.raises(errors.ChecksumMismatch, match=f'{path}: CRC-32C'):
    checksums.verify(written)


def test_a_listed_file_gone_is_named(written):
  os.remove(written / 'sub' / 'b')
  with pytest.raises(errors.ChecksumMismatch,
                     match=r'sub/b: missing, though checksums.json lists it'):
    checksums.verify(written)


@pytest.mark.parametrize('text', ['{"files": {"a.npy": "zz"}}', '[1]',
                                  '\x8b garbage'])
def test_a_garbled_manifest_is_named(written, text):
  (written / checksums.MANIFEST).write_text(text)
  with pytest.raises(errors.ChecksumMismatch,
                     match=f'{written / checksums.MANIFEST}: not a checksum'):
    checksums.verify(written)


def test_a_directory_without_a_manifest_is_read_unchecked(written, caplog):
  os.remove(written / checksums.MANIFEST)
  flip_a_bit(written / 'a.npy')
  with caplog.at_level('INFO', logger='realm_jax'):
    checksums.verify(written)
    checksums.verify(written)
  assert caplog.text.count('read unchecked') == 1


def test_files_added_after_the_manifest_are_not_checked(written):
  """Orbax's commit marker is written after `finalize`."""
  (written / 'commit_success.txt').write_text('done')
  (written / 'new').write_text('x')
  checksums.verify(written)


@pytest.fixture
def pieced(tmp_path, monkeypatch):
  """A file of 1,000 bytes in pieces of 64 (the last one short), with a
  manifest of whole and piece checksums."""
  monkeypatch.setattr(checksums, 'PIECE', 64)
  (tmp_path / 'data').write_bytes(np.random.default_rng(0).bytes(1000))
  checksums.write(tmp_path, pieces=True)
  return tmp_path


def test_a_read_checks_the_pieces_it_touches_and_only_them(pieced):
  """Each flipped bit is refused by exactly the reads that touch its piece,
  naming the file and the piece's bytes; the whole-file check still holds."""
  path = pieced / 'data'
  original = path.read_bytes()
  checksums.verify(pieced)
  for position in range(0, len(original) * 8, 61):
    flipped = bytearray(original)
    flipped[position // 8] ^= 1 << position % 8
    path.write_bytes(bytes(flipped))
    piece = position // 8 // 64
    reads = checksums.open_pieces(pieced)
    for start in range(0, 1000, 100):  # Reads of 100 bytes, in order.
      stop = start + 100
      if start // 64 <= piece <= (stop - 1) // 64:
        with pytest.raises(
            errors.ChecksumMismatch,
            match=f'{path}: CRC-32C .* in bytes {piece * 64:,} to '):
          reads.check('data', start, stop)
      else:
        reads.check('data', start, stop)
    with pytest.raises(errors.ChecksumMismatch, match=f'{path}: CRC-32C'):
      checksums.verify(pieced)
  path.write_bytes(original)
  reads = checksums.open_pieces(pieced)
  reads.check('data', 0, 1000)
  reads.check('not listed', 0, 10**9)


def test_a_piece_is_read_once(pieced):
  reads = checksums.open_pieces(pieced)
  reads.check('data', 130, 140)
  path = pieced / 'data'
  flipped = bytearray(path.read_bytes())
  flipped[150] ^= 1  # In piece 2, after it was checked.
  path.write_bytes(bytes(flipped))
  reads.check('data', 140, 160)  # Not read again.
  with pytest.raises(errors.ChecksumMismatch):
    checksums.open_pieces(pieced).check('data', 140, 151)


@pytest.mark.parametrize('size', [999, 1001, 960, 1100])
def test_a_file_cut_short_or_grown_past_its_pieces_is_refused_at_open(
    pieced, size):
  path = pieced / 'data'
  data = path.read_bytes()
  path.write_bytes(data[:size] + bytes(max(0, size - len(data))))
  if -(-size // 64) == 16:  # The same number of pieces: the last one fails.
    reads = checksums.open_pieces(pieced)
    with pytest.raises(errors.ChecksumMismatch, match='in bytes 960 to'):
      reads.check('data', 990, 991)
  else:
    with pytest.raises(errors.ChecksumMismatch,
                       match=f'{size:,} bytes, but checksums.json has 16'):
      checksums.open_pieces(pieced)


def test_a_manifest_without_pieces_is_checked_whole_at_open(written):
  assert checksums.open_pieces(written) is None
  flip_a_bit(written / 'sub' / 'b')
  with pytest.raises(errors.ChecksumMismatch, match='sub/b: CRC-32C'):
    checksums.open_pieces(written)
