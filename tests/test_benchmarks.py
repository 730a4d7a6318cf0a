"""The benchmark runner: the analytic FLOP counts against XLA's, and a quick
run of every benchmark whose figures must be possible (recall 1 for exact
search, utilisation at most 1, our encoder computing what PyTorch's does);
likewise the accelerator mode's smoke run, its search sweep and its time
budget."""

import gzip
import importlib.util
import json
import math
import re

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
  below it (softmax, GELU and LayerNorm are ~3% at this width). The layers
  unrolled: XLA counts a loop's body once."""
  config = BertConfig(vocab_size=64, hidden_size=384, num_layers=2,
                      num_heads=2, intermediate_size=1536, scan_layers=False)
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
def test_a_slow_library_gemm_is_probed_not_timed_at_full_size(monkeypatch):
  """PyTorch's bfloat16 GEMM takes about a minute at 2048^3 on CPUs
  without bfloat16 units: a probe that projects past the limit gives its
  own rate, and a fast one is timed at full size."""
  torch = pytest.importorskip('torch')
  from benchmarks import peak  # pylint: disable=g-import-not-at-top
  sizes, mm = [], torch.mm
  def counted_mm(a, b):
    sizes.append(a.shape[0])
    return mm(a, b)
  monkeypatch.setattr(torch, 'mm', counted_mm)
  slow = peak.torch_matmul('float32', size=1024, calls=1, slow_s=0.0)
  assert slow['PyTorch'] > 0 and sizes == [256, 256]  # 1024^3 never ran.
  sizes.clear()
  fast = peak.torch_matmul('float32', size=256, calls=3, slow_s=1e9)
  assert fast['PyTorch'] > 0 and sizes == [64, 64] + [256] * 4


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

  saved = {row['saved']: row for row in rows['saves']}
  # The towers alone (shared: one BERT) against the towers, the reader and
  # AdamW's two moments of each.
  assert (saved['checkpoint']['gib_per_save'] >
          5 * saved['retriever snapshot']['gib_per_save'] > 0)
  for row in saved.values():
    assert row['blocked_s'] > 0 and row['write_s'] > 0

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
  for name in ('encoder', 'train_step', 'embed', 'mips', 'sharing', 'saves'):
    assert f'| {name} |' in out


@pytest.mark.unit
def test_sweep_keeps_to_its_time_budget_and_every_selection_agrees():
  """Exact selections find the same ids; a spent budget starts no row and
  says so; the table argument is never a constant of the program."""
  rows = mips.sweep(20_000, queries=16, calls=1, quick=True)
  assert [row['method'] for row in rows] == [
      'two_stage', 'two_stage', 'top_k', 'approx_max_k', 'two_stage']
  assert rows[-1]['program'] == 'ExactSearcher (sharded)'
  for row in rows:
    assert row['device'] == jax.devices()[0].device_kind
    assert row['compiler'].startswith(f'jax {jax.__version__}')
    assert row['same_ids'] == 1.0, row
    assert row['ms'] > 0 and row['ratio_to_bound'] > 0
    assert row['bound_ms'] == max(row['flops_bound_ms'],
                                  row['read_bound_ms'])
    assert row['tflop_per_s'] == pytest.approx(
        2 * 16 * 20_000 * 128 / row['ms'] / 1e9)
  spent = mips.sweep(20_000, queries=16, calls=1, quick=True, budget_s=0)
  assert all('time budget' in row['skipped'] for row in spent)


@pytest.mark.unit
def test_accelerator_table_has_docs_columns_and_says_what_did_not_run():
  rows = [{'benchmark': 'mips_sweep', 'device': 'NVIDIA H200',
           'compiler': 'jax 0.11.2 (gpu)', 'rows': 13_353_718,
           'program': 'exact_search', 'method': 'two_stage',
           'chunk_size': 262144, 'group': 128, 'unroll': 1, 'ms': 24.7,
           'bound_ms': 1.77, 'scores_round_trip_ms': 11.4,
           'ratio_to_bound': 13.96, 'same_ids': 1.0},
          {'benchmark': 'mips_sweep', 'device': 'NVIDIA H200',
           'method': 'top_k', 'chunk_size': 65536, 'group': '',
           'skipped': 'time budget of 90 s spent'}]
  text = run.accelerator_table('mips', rows)
  lines = text.splitlines()
  assert lines[0] == '### Exact search, top-8 of 512 queries, bfloat16 rows'
  assert lines[2].startswith('| device | compiler | rows |')
  assert ('| NVIDIA H200 | jax 0.11.2 (gpu) | 13,353,718 | exact_search | '
          'two_stage | 262,144 | 128 | 1 | 24.70 | 1.77 | 11.40 | 14.0 | '
          '1.0000 |  |'
          ) == lines[4]
  assert lines[5].endswith('| time budget of 90 s spent |')


@pytest.mark.integration
@pytest.mark.slow
def test_accelerator_quick_run_of_every_row(tmp_path, capsys):
  """`python -m benchmarks.run --accelerator --quick`: the GPU command's
  every row at tiny sizes, PyTorch's encoder included where installed."""
  cache_dir = jax.config.jax_compilation_cache_dir
  path = run.main(['--accelerator', '--quick', f'--output_dir={tmp_path}'])
  # The run's own compilation cache is gone, the process's setting back.
  assert jax.config.jax_compilation_cache_dir == cache_dir
  assert path.endswith('-accelerator-quick.json')
  report = json.loads(open(path, encoding='utf-8').read())
  assert report['accelerator'] and report['quick']
  rows = {}
  for row in report['rows']:
    rows.setdefault(row['benchmark'], []).append(row)
  assert set(rows) == {'encoder', 'train_step', 'embed', 'mips_sweep',
                       'saves'}
  kind = jax.devices()[0].device_kind
  for row in report['rows']:
    assert 'error' not in row and 'skipped' not in row, row
    assert row['device'] == kind and 'jax' in row['compiler'], row
  encoder = {row['model']: row for row in rows['encoder']}
  assert set(encoder) == {'bert-tiny (random)', 'minilm-l6'}
  if importlib.util.find_spec('torch'):
    for row in encoder.values():
      assert 'torch' in row['compiler'] and row['time_ratio'] > 0
      # bfloat16 on both sides: agreement to its rounding.
      assert row['max_abs_diff'] < 0.25 * max(1.0, row['mean_abs_output'])
  training_form = [row for row in rows['encoder'] if not row['forward_only']]
  assert [row['model'] for row in training_form] == ['bert-tiny (random)']
  step, cached, unrolled = rows['train_step']
  for row in (step, cached, unrolled):
    assert row['setup'] == 'gin/setups/gpu.gin' and row['dtype'] == 'bfloat16'
    assert row['first_step_s'] > row['step_seconds'] > 0
    assert math.isfinite(row['loss'])
  # The second trainer's step is read from the persistent cache the first
  # one's compile wrote; the unrolled step is a new program.
  assert step['cache_misses'] > 0 and step['cache_hits'] == 0
  assert cached['compiled'] == 'from the cache' and cached['cache_hits'] > 0
  assert cached['cache_misses'] == 0
  assert unrolled['scan_unroll'] == 2 and unrolled['cache_misses'] > 0
  for row in rows['train_step'] + rows['embed']:
    assert 0 < row['mfu'] <= 1, row
  assert {row['model'] for row in rows['embed']} == {'tiny', 'minilm-l6'}
  assert all(row['same_ids'] == 1.0 for row in rows['mips_sweep'])
  out = capsys.readouterr().out
  for heading in run.ACCELERATOR_COLUMNS.values():
    assert f'### {heading[0]}' in out


@pytest.mark.unit
def test_the_accelerator_train_rows_follow_the_cards_memory(monkeypatch):
  """The GPU command's train-step rows for BERT-base: an 80 GB card runs
  batch 64 rematerialized and, last, batch 32 keeping every activation
  with the layers unrolled; a 16 GB one neither. The rows' order and settings, not their times (each
  step is stood in for: nothing here compiles BERT-base)."""
  import argparse  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  asked = []

  def step(run_name, model, batch, steps, dtype, bindings, setups=()):
    del run_name, dtype, setups
    asked.append((model, batch, steps) + tuple(b.split(' = ')[1]
                                               for b in bindings[-2:]))
    return {'step_seconds': 0.1}
  monkeypatch.setattr(train_step, 'measure', step)
  rows = {}
  for gib in (80, 16):
    monkeypatch.setattr(train_step, '_memory_limit', lambda g=gib: g * 2**30)
    asked.clear()
    train_step.accelerator(argparse.Namespace(quick=False))
    rows[gib] = list(asked)
  # Batch 8: 10 steps, 2 from the cache, 10 unrolled.
  small = [('bert-base', 8, 10, "'none'", '1'),
           ('bert-base', 8, 2, "'none'", '1'),
           ('bert-base', 8, 10, "'none'", '12')]
  assert rows[80] == [('bert-base', 64, 10, "'full'", '1'), *small,
                      ('bert-base', 32, 10, "'none'", '12')]
  assert rows[16] == [('bert-base', 16, 10, "'full'", '1'), *small]


@pytest.mark.unit
def test_the_accelerator_train_rows_expect_their_time_by_form(monkeypatch):
  """With 80 s left for each row: the first unrolled row is expected to
  take 2.6x the scanned ones (30 s each here), and runs; the one after it
  is expected to take about what it took (60 s), and runs too."""
  import argparse  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  clock = [0.0]

  def step(run_name, model, batch, steps, dtype, bindings, setups=()):
    del run_name, model, batch, steps, dtype, setups
    clock[0] += 60.0 if bindings[-1].endswith('12') else 30.0
    return {'step_seconds': 0.1}
  monkeypatch.setattr(train_step, 'measure', step)
  monkeypatch.setattr(train_step, 'time',
                      types.SimpleNamespace(perf_counter=lambda: clock[0]))
  monkeypatch.setattr(train_step, '_memory_limit', lambda: 80 * 2 ** 30)
  rows = train_step.accelerator(argparse.Namespace(quick=False,
                                                   time_left=lambda: 80.0))
  assert [(r['batch'], r['scan_unroll'], 'skipped' in r) for r in rows] == [
      (64, 1, False), (8, 1, False), (8, 1, False), (8, 12, False),
      (32, 12, False)]
  assert train_step._row_estimate({False: 30.0}, True, False) == 78.0  # pylint: disable=protected-access
  assert train_step._row_estimate({False: 30.0, True: 60.0}, True,  # pylint: disable=protected-access
                                  False) == 78.0


@pytest.mark.unit
def test_a_profile_sums_each_device_line_by_name_and_kind(tmp_path):
  from benchmarks import profile  # pylint: disable=g-import-not-at-top
  meta = lambda pid, tid, what, name: {
      'ph': 'M', 'pid': pid, 'tid': tid, 'name': what, 'args': {'name': name}}
  kernel = lambda name, ts, dur: {'ph': 'X', 'pid': 2, 'tid': 7,
                                  'name': name, 'ts': ts, 'dur': dur}
  events = [meta(1, None, 'process_name', '/host:CPU'),
            meta(2, None, 'process_name', '/device:GPU:0'),
            meta(2, 7, 'thread_name', 'Stream #7'),
            {'ph': 'X', 'pid': 1, 'tid': 3, 'name': 'python', 'ts': 0,
             'dur': 5000},
            # Two steps: a matmul, an overlapping fusion, an attention.
            kernel('nvjet_hsh_256x128_gemm', 0, 400),
            kernel('loop_fusion.12', 300, 200),
            kernel('cudnn_generated_fort_native_sdpa', 1000, 100),
            kernel('nvjet_hsh_256x128_gemm', 2000, 400),
            kernel('loop_fusion.13', 2400, 200),
            kernel('cudnn_generated_fort_native_sdpa', 3000, 100)]
  trace = tmp_path / 'perfetto_trace.json.gz'
  with gzip.open(trace, 'wt') as f:
    json.dump({'traceEvents': events}, f)
  lines = profile.summarize(str(trace), steps=2)
  assert list(lines) == ['/device:GPU:0 Stream #7']  # Not the host's.
  line = lines['/device:GPU:0 Stream #7']
  # 0-500 (the fusion overlaps the matmul), 1000-1100, 2000-2600, 3000-3100.
  assert line['busy_ms_a_step'] == pytest.approx(1.3 / 2)
  assert line['kinds_ms_a_step'] == pytest.approx(
      {'matmul': 0.4, 'other fusions': 0.2, 'attention': 0.1})
  fusion = next(t for t in line['top'] if t['name'] == 'loop_fusion')
  assert fusion['calls_a_step'] == 1 and fusion['ms_a_step'] == 0.2


@pytest.mark.integration
def test_a_forward_profile_writes_its_summary_and_trace(tmp_path):
  """`python -m benchmarks.profile --forward` at a tiny size on this
  machine: on a CPU the host's XLA threads stand in for the device."""
  from benchmarks import profile  # pylint: disable=g-import-not-at-top
  profile.main(['--forward', '--model=tiny', '--batch=2', '--length=16',
                '--steps=2', f'--output_dir={tmp_path}'])
  result = json.loads((tmp_path / 'profile.json').read_text())
  assert (result['run'], result['batch'], result['length']) == (
      'forward', 2, 16)
  assert result['step_ms'] > 0 and result['model_tflop_per_step'] > 0
  assert result['lines'] and all(
      line['busy_ms_a_step'] > 0 for line in result['lines'].values())
  assert (tmp_path / 'perfetto_trace.json.gz').exists()
  assert (tmp_path / 'profile.md').read_text().startswith('forward step')


@pytest.mark.unit
def test_compiled_kernels_count_a_loops_body_once_a_trip():
  """A scan of 6 trips over rows of 8 floats: its body's kernels launch 6
  times; the stacked output is written a row at a time (in place), and
  the row the body reads of the scanned input is a slice of it."""
  from benchmarks import compiled_kernels  # pylint: disable=g-import-not-at-top

  def f(carry, xs):
    def body(c, x):
      y = jnp.sin(c * x)
      return y, y
    return jax.lax.scan(body, carry, xs)
  text = jax.jit(f).lower(jnp.zeros(8), jnp.ones((6, 8))).compile().as_text()
  kinds = compiled_kernels.kernels(text)
  # Each trip reads the carry, one row of xs (not all 6) and the index and
  # writes a row: into the stacked ys in place, not the whole of them.
  trip = 8 * 4 + 8 * 4 + 4 + 8 * 4
  stacked = [row for kind, row in kinds.items()
             if re.search('dynamic.update.slice', kind)]
  assert stacked == [{'launches': 6, 'bytes': 6 * trip}], kinds
  sine = [row for kind, row in kinds.items() if 'sine' in kind]
  assert sine == [{'launches': 6, 'bytes': 6 * trip}], kinds
  assert compiled_kernels.nbytes('(bf16[2,3]{1,0}, pred[4])') == 16


@pytest.mark.unit
def test_compiled_kernels_read_only_the_slices_a_fusion_takes():
  """A fusion that reads a third of a product's output (q of a joint q, k,
  v product) reads that third; one that also reads the operand whole
  reads it whole."""
  from benchmarks import compiled_kernels  # pylint: disable=g-import-not-at-top

  def program(consumer_reads_whole):
    fused = ['%p = bf16[4,12]{1,0} parameter(0)',
             '%q = bf16[4,4]{1,0} slice(%p), slice={[0:4], [0:4]}',
             'ROOT %c = f32[4,4]{1,0} convert(%q)']
    if consumer_reads_whole:
      fused[-1:] = ['%r = bf16[4,12]{1,0} negate(%p)',
                    '%s = bf16[4,4]{1,0} slice(%r), slice={[0:4], [4:8]}',
                    '%t = bf16[4,4]{1,0} add(%q, %s)',
                    'ROOT %c = f32[4,4]{1,0} convert(%t)']
    return '\n'.join([
        'HloModule m', '', '%fused (p: bf16[4,12]) -> f32[4,4] {',
        *[f'  {line}' for line in fused], '}', '',
        'ENTRY %main (a: bf16[4,12]) -> f32[4,4] {',
        '  %a = bf16[4,12]{1,0} parameter(0)',
        '  ROOT %loop_convert_fusion = f32[4,4]{1,0} fusion(%a), kind=kLoop, '
        'calls=%fused', '}'])
  assert compiled_kernels.kernels(program(False)) == {
      'loop_convert_fusion': {'launches': 1, 'bytes': 4 * 4 * 2 + 4 * 4 * 4}}
  assert compiled_kernels.kernels(program(True)) == {
      'loop_convert_fusion': {'launches': 1, 'bytes': 4 * 12 * 2 + 4 * 4 * 4}}


@pytest.mark.unit
def test_compiled_kernels_read_every_operand_of_a_wide_fusion():
  """XLA writes /*index=5*/ before a fusion's sixth operand."""
  from benchmarks import compiled_kernels  # pylint: disable=g-import-not-at-top
  params = ', '.join(f'p{i}: f32[2]' for i in range(6))
  text = '\n'.join([
      'HloModule m', '',
      f'%fused ({params}) -> f32[2] {{',
      *[f'  %p{i} = f32[2]{{0}} parameter({i})' for i in range(6)],
      '  ROOT %sum = f32[2]{0} add(%p0, %p5)', '}', '',
      'ENTRY %main (a: f32[2]) -> f32[2] {',
      '  %a = f32[2]{0} parameter(0)',
      '  ROOT %loop_add_fusion = f32[2]{0} fusion(%a, %a, %a, %a, %a, '
      '/*index=5*/%a), kind=kLoop, calls=%fused', '}'])
  assert compiled_kernels.kernels(text) == {
      'loop_add_fusion': {'launches': 1, 'bytes': 7 * 2 * 4}}
