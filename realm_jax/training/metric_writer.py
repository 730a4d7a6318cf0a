"""Train metrics to TensorBoard event files, the log, and a JSONL file.

The JSONL file (one {"step": ..., name: value} object per write) is what
scripts and plots read without TensorBoard. model_dir may be local or gs://.
A run resumed from step s first drops the rows after s (written before a
kill, past the checkpoint it resumes from), so each step's row is written
exactly once whatever was killed when.

Nothing here imports TensorFlow: the event files are encoded by hand, so
that training machines need neither TensorFlow nor clu. (tensorboardX
writes the same records, but reaches gs:// only through
google-cloud-storage; these go through epath, as every file of a run does.)
"""

import contextlib
import itertools
import json
import logging
import os
import socket
import struct
import time

import jax
from etils import epath

from realm_jax import checksums

log = logging.getLogger(__name__)
_WRITERS = itertools.count()


class JsonlWriter:
  """Appends scalars as JSON lines."""

  def __init__(self, path: str):
    self.path = path
    # Open until close(), on any filesystem epath reaches.
    self._open = contextlib.ExitStack()
    self._file = self._open.enter_context(epath.Path(path).open('a'))

  def write_scalars(self, step, scalars):
    row = {'step': int(step)}
    row.update({k: float(v) for k, v in scalars.items()})
    self._file.write(json.dumps(row) + '\n')

  def flush(self):
    self._file.flush()

  def close(self):
    self._open.close()


def _masked_crc(data: bytes) -> int:
  return checksums.masked(checksums.extend(0, data))


def _varint(value: int) -> bytes:
  value &= (1 << 64) - 1  # Negative int64s as their two's complement.
  out = bytearray()
  while value > 0x7F:
    out.append(value & 0x7F | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _length_delimited(field: int, data: bytes) -> bytes:
  return _varint(field << 3 | 2) + _varint(len(data)) + data


_FILE_VERSION, _SUMMARY = 3, 5  # Event's fields besides wall_time and step.


def _event(step: int, field: int, data: bytes) -> bytes:
  """A serialized tensorflow.Event: wall_time (1), step (2), and `data` as
  its file_version or summary."""
  return (_varint(1 << 3 | 1) + struct.pack('<d', time.time()) +
          _varint(2 << 3) + _varint(step) + _length_delimited(field, data))


def _scalar_summary(scalars) -> bytes:
  """A serialized tensorflow.Summary of Values with a tag (1) and a
  simple_value (2), which TensorBoard shows as scalars."""
  return b''.join(
      _length_delimited(1, _length_delimited(1, tag.encode()) +
                        _varint(2 << 3 | 5) + struct.pack('<f', float(value)))
      for tag, value in scalars.items())


def _record(data: bytes) -> bytes:
  """TFRecord framing, which TensorBoard's reader checks."""
  length = struct.pack('<Q', len(data))
  return (length + struct.pack('<I', _masked_crc(length)) + data +
          struct.pack('<I', _masked_crc(data)))


class EventFileWriter:
  """Scalars to a TensorBoard event file in `logdir`."""

  def __init__(self, logdir: str):
    directory = epath.Path(logdir)
    directory.mkdir(parents=True, exist_ok=True)
    # A file of its own per writer (its pid and number: two in one second),
    # never appended to: gs:// objects cannot be.
    name = (f'events.out.tfevents.{int(time.time()):010d}.'
            f'{socket.gethostname()}.{os.getpid()}.{next(_WRITERS)}')
    self.path = str(directory / name)
    self._open = contextlib.ExitStack()
    self._file = self._open.enter_context(epath.Path(self.path).open('wb'))
    self._file.write(_record(_event(0, _FILE_VERSION, b'brain.Event:2')))

  def write_scalars(self, step, scalars):
    self._file.write(
        _record(_event(int(step), _SUMMARY, _scalar_summary(scalars))))

  def flush(self):
    self._file.flush()

  def close(self):
    self._open.close()


class MetricWriter:
  """Logs each write and passes it on to `writers`."""

  def __init__(self, writers=()):
    self.writers = list(writers)

  def write_scalars(self, step, scalars):
    log.info('[%d] %s', int(step), ', '.join(
        f'{k}={float(v):.6g}' for k, v in sorted(scalars.items())))
    for writer in self.writers:
      writer.write_scalars(step, scalars)

  def flush(self):
    for writer in self.writers:
      writer.flush()

  def close(self):
    for writer in self.writers:
      writer.close()


def metrics_path(model_dir: str, name: str = 'train') -> str:
  return os.path.join(model_dir, f'{name}_metrics.jsonl')


def create_writer(model_dir: str, name: str = 'train') -> MetricWriter:
  """TensorBoard + log + model_dir/<name>_metrics.jsonl (process 0 only; the
  others only log)."""
  if jax.process_index() > 0:
    return MetricWriter()
  epath.Path(model_dir).mkdir(parents=True, exist_ok=True)
  return MetricWriter([
      EventFileWriter(os.path.join(model_dir, 'tensorboard', name)),
      JsonlWriter(metrics_path(model_dir, name)),
  ])


def drop_rows_after(path: str, step: int) -> int:
  """Keeps the rows of steps <= `step` (and drops a last line a kill cut
  short); returns how many rows were dropped. The file is replaced whole."""
  path = epath.Path(path)
  if not path.exists():
    return 0
  kept, dropped = [], 0
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
      keep = int(row['step']) <= step
    except (ValueError, KeyError, TypeError):
      keep = False  # Cut short by a kill mid-write.
    if keep:
      kept.append(line + '\n')
    else:
      dropped += 1
  if dropped:
    partial = path.parent / f'.{path.name}.{os.getpid()}'
    partial.write_text(''.join(kept))
    partial.replace(path)
    log.info('%s: dropped %d rows past step %d, the checkpoint this run '
             'resumes from', path, dropped, step)
  return dropped
