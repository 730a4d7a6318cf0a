"""Train metrics to TensorBoard event files, the log, and a JSONL file.

The JSONL file (one {"step": ..., name: value} object per write) is what
scripts and plots read without TensorBoard.
"""

import json
import os

import jax
from clu import metric_writers


class JsonlWriter(metric_writers.LoggingWriter):
  """Appends scalars as JSON lines; everything else goes to the log."""

  def __init__(self, path: str):
    super().__init__()
    self.path = path
    self._file = open(path, 'a', encoding='utf-8')  # pylint: disable=consider-using-with

  def write_scalars(self, step, scalars):
    row = {'step': int(step)}
    row.update({k: float(v) for k, v in scalars.items()})
    self._file.write(json.dumps(row) + '\n')

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


def metrics_path(model_dir: str, name: str = 'train') -> str:
  return os.path.join(model_dir, f'{name}_metrics.jsonl')


def create_writer(model_dir: str, name: str = 'train'
                  ) -> metric_writers.MetricWriter:
  """TensorBoard + log + model_dir/<name>_metrics.jsonl (process 0 only)."""
  if jax.process_index() > 0:
    return metric_writers.create_default_writer(just_logging=True)
  os.makedirs(model_dir, exist_ok=True)
  return metric_writers.MultiWriter([
      metric_writers.create_default_writer(
          os.path.join(model_dir, 'tensorboard', name), asynchronous=False),
      JsonlWriter(metrics_path(model_dir, name)),
  ])
