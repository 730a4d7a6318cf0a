"""The benchmark runner: the analytic FLOP counts against XLA's, and a quick
run of every benchmark whose figures must be possible (recall 1 for exact
search, utilisation at most 1, our encoder computing what PyTorch's does)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import mips, run
from realm_jax.models import flops
from realm_jax.models.bert import Bert, BertConfig


@pytest.mark.unit
def test_encoder_flops_are_xlas_matmuls():
  """XLA counts every op; the analytic count, matmuls only, must be just
  below it (softmax, GELU and LayerNorm are ~3% at this width)."""
  config = BertConfig(vocab_size=64, hidden_size=384, num_layers=2,
                      num_heads=2, intermediate_size=1536)
  model = Bert(config)
  ids = jnp.zeros((2, 128), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), ids, ids)
  cost = jax.jit(lambda p, x: model.apply(p, x, jnp.ones_like(x))
                 .sequence_output).lower(params, ids).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  analytic = 2 * flops.encoder_forward(config, 128)
  assert analytic < cost['flops'] < 1.06 * analytic


@pytest.mark.unit
def test_step_flops_add_up_from_the_towers_and_the_reader():
  config = BertConfig(vocab_size=100, hidden_size=8, num_layers=1,
                      num_heads=1, intermediate_size=16)
  tower = lambda length: flops.encoder_forward(config, length) + 2 * 8 * 4
  reader = flops.encoder_forward(config, 40) + 2 * 3 * (64 + 800)
  assert flops.pretrain_example(config, config, 4, 10, 20, 40, 5, 3) == (
      tower(10) + 5 * tower(20) + 5 * reader)
  assert flops.ict_example(config, 4, 10, 20, 6) == (
      tower(10) + tower(20) + 2 * 6 * 4)


@pytest.mark.unit
def test_numpy_top_k_and_recall():
  rows = np.eye(10, 4, dtype=np.float32) * np.arange(10)[:, None]
  queries = np.ones((1, 4), np.float32)
  assert sorted(mips.numpy_top_k(queries, rows, 2)[0]) == [2, 3]
  assert mips.recall([[1, 2]], [[2, 5]]) == 0.5
  rng = np.random.default_rng(0)
  rows, queries = rng.standard_normal((1000, 8)), rng.standard_normal((5, 8))
  whole = np.argsort(-(queries @ rows.T), axis=1)[:, :8]
  np.testing.assert_array_equal(mips.numpy_top_k(queries, rows, chunk=7),
                                whole)


@pytest.mark.integration
@pytest.mark.slow
def test_quick_run_of_every_benchmark_writes_its_tables_as_json(tmp_path,
                                                               capsys):
  path = run.main(['--quick', f'--output_dir={tmp_path}'])
  report = json.loads(open(path, encoding='utf-8').read())
  rows = {}
  for row in report['rows']:
    rows.setdefault(row['benchmark'], []).append(row)
  assert report['machine']['cpu_count'] > 0

  encoder, = rows['encoder']
  assert encoder['max_abs_diff'] < 1e-3  # The same function as PyTorch's.
  assert encoder['time_ratio'] > 0

  for row in rows['train_step'] + rows['embed']:
    assert 0 < row['mfu'] <= 1, row
  assert {row['run'] for row in rows['train_step']} == {'pretrain', 'ict'}
  assert all(math.isfinite(row['loss']) for row in rows['train_step'])
  embed, = rows['embed']
  assert math.isclose(embed['refresh_minutes_16_chips'] * 16 * 60,
                      13_353_718 / embed['docs_per_s'])

  sharing, = rows['sharing']
  if 'skipped' not in sharing:  # One core: nothing to share.
    assert sharing['trainer_steps_per_s'] > 0
    assert sharing['demo_refresh_s'] == 10_054 / sharing['builder_docs_per_s']

  mips_rows = {(row['dtype'], row['searcher']): row for row in rows['mips']}
  assert mips_rows['float32', 'numpy']['recall_at_8'] == 1.0
  assert mips_rows['float32', 'exact']['recall_at_8'] == 1.0
  assert mips_rows['float32', 'scann']['recall_at_8'] >= 0.99
  # bfloat16 rows swap neighbours whose scores differ by its rounding.
  assert 0.95 <= mips_rows['bfloat16', 'exact']['recall_at_8'] < 1
  for name in ('numpy', 'exact', 'scann'):
    assert mips_rows['float32', name]['qps_batch_512'] > 0
    assert (mips_rows['float32', name]['index_bytes'] >=
            mips.QUICK_ROWS * 128 * 4)
  assert (mips_rows['bfloat16', 'exact']['index_bytes'] >=
          mips.QUICK_ROWS * 128 * 2)
  out = capsys.readouterr().out
  for name in ('encoder', 'train_step', 'embed', 'mips', 'sharing'):
    assert f'| {name} |' in out
