"""Train metrics to TensorBoard event files, the log, and a JSONL file.

The JSONL file (one {"step": ..., name: value} object per write) is what
scripts and plots read without TensorBoard. model_dir may be local or gs://.
A run resumed from step s first drops the rows after s (written before a
kill, past the checkpoint it resumes from), so each step's row is written
exactly once whatever was killed when.
"""

import contextlib
import json
import logging
import os

import jax
from clu import metric_writers
from etils import epath


class JsonlWriter(metric_writers.LoggingWriter):
  """Appends scalars as JSON lines; everything else goes to the log."""

  def __init__(self, path: str):
    super().__init__()
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


def metrics_path(model_dir: str, name: str = 'train') -> str:
  return os.path.join(model_dir, f'{name}_metrics.jsonl')


def create_writer(model_dir: str, name: str = 'train'
                  ) -> metric_writers.MetricWriter:
  """TensorBoard + log + model_dir/<name>_metrics.jsonl (process 0 only)."""
  if jax.process_index() > 0:
    return metric_writers.create_default_writer(just_logging=True)
  epath.Path(model_dir).mkdir(parents=True, exist_ok=True)
  return metric_writers.MultiWriter([
      metric_writers.create_default_writer(
          os.path.join(model_dir, 'tensorboard', name), asynchronous=False),
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
    logging.info('%s: dropped %d rows past step %d, the checkpoint this run '
                 'resumes from', path, dropped, step)
  return dropped
