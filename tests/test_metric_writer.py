"""The metrics JSONL across a kill and a resume, each step's row once; and
the TensorBoard event files, which TensorBoard reads and which need neither
TensorFlow nor clu to write."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from realm_jax.training import metric_writer
from realm_jax.training.metric_writer import drop_rows_after

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.unit
def test_a_resumed_run_drops_the_rows_past_its_checkpoint(tmp_path):
  """Rows 1-7 were written, then a kill cut row 8 short; the run resumes
  from checkpoint 5."""
  path = tmp_path / 'train_metrics.jsonl'
  rows = [{'step': s, 'loss': 1.0 / s} for s in range(1, 8)]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows) +
                  '{"step": 8, "lo')
  assert drop_rows_after(str(path), 5) == 3
  assert [json.loads(line) for line in path.read_text().splitlines()] == \
      rows[:5]
  assert [p.name for p in tmp_path.iterdir()] == [path.name]  # No leftovers.
  assert drop_rows_after(str(path), 5) == 0
  assert drop_rows_after(str(tmp_path / 'none.jsonl'), 5) == 0


def _events(logdir):
  """The events of the one event file in `logdir` as written, read by
  TensorBoard's reader (which checks the framing's checksums)."""
  loader = pytest.importorskip(
      'tensorboard.backend.event_processing.event_file_loader')
  [path] = logdir.glob('events.out.tfevents.*')
  return list(loader.LegacyEventFileLoader(str(path)).Load())


@pytest.mark.unit
def test_the_writer_writes_jsonl_rows_and_tensorboard_scalars(tmp_path):
  writer = metric_writer.create_writer(str(tmp_path))
  writer.write_scalars(1, {'loss': 2.5, 'eval/accuracy': np.float32(0.25)})
  writer.write_scalars(10, {'loss': 1.5})
  writer.flush()
  events = _events(tmp_path / 'tensorboard' / 'train')
  writer.close()
  assert events[0].file_version == 'brain.Event:2'
  assert [(e.step, {v.tag: v.simple_value for v in e.summary.value})
          for e in events[1:]] == [(1, {'loss': 2.5, 'eval/accuracy': 0.25}),
                                   (10, {'loss': 1.5})]
  assert all(abs(e.wall_time - time.time()) < 60 for e in events)
  rows = (tmp_path / 'train_metrics.jsonl').read_text().splitlines()
  assert [json.loads(row) for row in rows] == [
      {'step': 1, 'loss': 2.5, 'eval/accuracy': 0.25},
      {'step': 10, 'loss': 1.5}]
  accumulator = pytest.importorskip(
      'tensorboard.backend.event_processing.event_accumulator')
  scalars = accumulator.EventAccumulator(
      str(tmp_path / 'tensorboard' / 'train')).Reload()
  assert [(s.step, s.value) for s in scalars.Scalars('loss')] == [
      (1, 2.5), (10, 1.5)]


@pytest.mark.unit
def test_only_process_0_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  writer = metric_writer.create_writer(str(tmp_path / 'run'))
  writer.write_scalars(1, {'loss': 1.0})
  writer.close()
  assert not (tmp_path / 'run').exists()


# Absent as on a machine without them: `import` fails, and find_spec (which
# epath asks whether TensorFlow is there) answers None.
BLOCKED = """
import sys

for name in ('clu', 'tensorflow'):
  sys.modules[name] = None
from realm_jax.training import metric_writer
writer = metric_writer.create_writer(sys.argv[1])
writer.write_scalars(3, {'loss': 0.5})
writer.close()
assert not [m for m in sys.modules if m.startswith(('clu.', 'tensorflow.'))]
"""


@pytest.mark.integration
def test_the_writer_needs_neither_clu_nor_tensorflow(tmp_path):
  subprocess.run([sys.executable, '-c', BLOCKED, str(tmp_path)], check=True,
                 cwd=REPO)
  assert json.loads((tmp_path / 'train_metrics.jsonl').read_text()) == {
      'step': 3, 'loss': 0.5}
  [event] = _events(tmp_path / 'tensorboard' / 'train')[1:]
  assert (event.step, event.summary.value[0].tag,
          event.summary.value[0].simple_value) == (3, 'loss', 0.5)
