"""The benchmark runner's MIPS rows: recall is measured against brute force,
so the exact searcher must score 1 and ScaNN its documented >= 0.99."""

import json

import numpy as np

from benchmarks import mips, run


def test_numpy_top_k_and_recall():
  rows = np.eye(10, 4, dtype=np.float32) * np.arange(10)[:, None]
  queries = np.ones((1, 4), np.float32)
  assert sorted(mips.numpy_top_k(queries, rows, 2)[0]) == [2, 3]
  assert mips.recall([[1, 2]], [[2, 5]]) == 0.5


def test_quick_mips_run_writes_its_table_as_json(tmp_path, capsys):
  path = run.main(['--quick', '--only', 'mips', f'--output_dir={tmp_path}'])
  report = json.loads(open(path, encoding='utf-8').read())
  by_searcher = {row['searcher']: row for row in report['rows']}
  assert by_searcher['numpy']['recall_at_8'] == 1.0
  assert by_searcher['exact']['recall_at_8'] == 1.0
  assert by_searcher['scann']['recall_at_8'] >= 0.99
  for name in ('numpy', 'exact', 'scann'):
    assert by_searcher[name]['qps_batch_512'] > 0
    assert by_searcher[name]['index_bytes'] >= 100_000 * 128 * 4
  assert report['machine']['cpu_count'] > 0
  assert '| mips |' in capsys.readouterr().out
