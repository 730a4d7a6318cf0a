"""The metrics JSONL becomes a PNG of the curves."""

import json

import pytest

from realm_jax.training import curves

pytestmark = pytest.mark.unit


def _write(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))


def test_a_resumed_step_keeps_its_last_value(tmp_path):
  path = tmp_path / 'train_metrics.jsonl'
  _write(path, [{'step': 1, 'loss': 3.0}, {'step': 2, 'loss': 2.0},
                {'step': 2, 'loss': 2.5}, {'step': 3, 'loss': 1.0}])
  assert curves.read_metrics(str(path))['loss'] == ([1, 2, 3], [3.0, 2.5, 1.0])


def test_plot_draws_train_and_held_out_curves(tmp_path):
  path, png = tmp_path / 'm.jsonl', tmp_path / 'm.png'
  _write(path, [{'step': 0, 'eval/loss': 4.0, 'eval/retrieval_utility': -0.1},
                {'step': 5, 'loss': 3.0, 'retrieval_utility': 0.1,
                 'steps_per_second': 2.0},
                {'step': 10, 'loss': 2.0, 'eval/loss': 2.5}])
  assert curves.plot_curves(str(path), str(png)) == ['loss',
                                                     'retrieval_utility']
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_bad_lines_and_empty_files_are_named(tmp_path):
  path = tmp_path / 'm.jsonl'
  path.write_text('{"step": 1, "loss": 1.0}\nnot json\n')
  with pytest.raises(ValueError, match=r'm.jsonl:2: not JSON'):
    curves.read_metrics(str(path))
  _write(path, [{'step': 1, 'steps_per_second': 1.0}])
  with pytest.raises(ValueError, match='has none of the metrics'):
    curves.plot_curves(str(path), str(tmp_path / 'm.png'))
