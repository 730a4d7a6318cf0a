"""The metrics JSONL across a kill and a resume: each step's row once."""

import json

import pytest

from realm_jax.training.metric_writer import drop_rows_after

pytestmark = pytest.mark.unit


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
