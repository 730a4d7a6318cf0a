"""The group-maxima kernels equal their XLA form: the GPU's and the TPU's in
Pallas's interpreter, on their own and inside exact search; the GPU
program lowers to its Triton kernel here, and XLA:TPU compiles the TPU's
(libtpu, where `make setup` installs it)."""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax import aot, gpu_compiler
from realm_jax.index import exact
from realm_jax.index.exact import Selection
from realm_jax.index.group_maxima import group_maxima

pytestmark = pytest.mark.unit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inputs(num_queries, num_rows, dim, dtype, group=64, seed=0):
  rng = np.random.default_rng(seed)
  queries = jnp.asarray(rng.standard_normal((num_queries, dim)), dtype)
  rows = jnp.asarray(rng.standard_normal((num_rows, dim)), dtype)
  bias = np.zeros(num_rows, np.float32)
  bias[rng.choice(num_rows, num_rows // 10, replace=False)] = -np.inf
  bias[:group] = -np.inf  # A whole group of rows that may not be returned.
  return queries, rows, jnp.asarray(bias)


@pytest.mark.parametrize('platform,num_queries,num_rows,group', [
    ('gpu', 9, 1024, 64),     # Queries padded to a block of 16.
    ('gpu', 130, 600, 128),   # Two blocks of 128 queries; 88 rows unread.
    ('tpu', 9, 4096, 128),    # Two whole steps of 16 groups.
    ('tpu', 130, 4530, 128),  # Two steps, 3 groups in the XLA form, 50 rows.
    ('cpu', 9, 70_000, 128),  # The XLA form: a block of 512 groups, then 34.
])
@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float32])
def test_kernels_equal_the_xla_form(platform, num_queries, num_rows, group,
                                    dtype, **program):
  queries, rows, bias = _inputs(num_queries, num_rows, 32, dtype, group)
  got = group_maxima(queries, rows, bias, group, platform, interpret=True,
                     **program)
  assert got.shape == (num_queries, num_rows // group)
  assert got.dtype == jnp.float32
  assert np.all(np.isneginf(got[:, 0]))  # The group of no usable row.
  whole = num_rows // group * group
  want = (np.asarray(queries, np.float64) @ np.asarray(rows[:whole],
                                                       np.float64).T
          + np.asarray(bias[:whole])).reshape(num_queries, -1, group).max(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('num_queries,num_rows,program_groups', [
    (9, 1024, 4),        # 16 groups: 4 whole spans.
    (9, 1024 + 200, 4),  # 19 groups: the last span of 3, then 8 rows.
    (9, 192, 16),        # 3 groups: one span, most of it past the table.
    (40, 1024 + 200, 4),  # 3 blocks of 16 queries, the last 8 padding.
])
@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float32])
def test_gpu_programs_scoring_several_groups_equal_the_xla_form(
    num_queries, num_rows, program_groups, dtype):
  """A GPU program scores `program_groups` groups in turn, its queries
  loaded once; the last program stops at the table's last whole group."""
  test_kernels_equal_the_xla_form('gpu', num_queries, num_rows, 64, dtype,
                                  program_groups=program_groups,
                                  program_queries=16)


def test_a_gpu_programs_shape_is_checked():
  queries, rows, bias = _inputs(2, 128, 16, jnp.float32)
  with pytest.raises(ValueError, match='program_groups=6: a power of two'):
    group_maxima(queries, rows, bias, 64, 'gpu', program_groups=6)
  with pytest.raises(ValueError, match='program_queries=8: a power of two'):
    group_maxima(queries, rows, bias, 64, 'gpu', program_queries=8)
  with pytest.raises(ValueError, match='groups of 256: at most 32,768'):
    exact.Selection(method='fused', group=256, program_queries=256)
  # Groups the kernel does not take: the XLA form, any program.
  assert exact.Selection(group=512, program_queries=256).group == 512


def _kernel_calls(fn, *args) -> int:
  jaxpr = jax.make_jaxpr(fn)(*args)
  return str(jaxpr).count('pallas_call')


@pytest.mark.parametrize('platform,group,dim,dtype,calls', [
    ('gpu', 64, 32, jnp.float32, 1),
    ('gpu', 96, 32, jnp.float32, 0),   # Triton tiles powers of two only,
    ('gpu', 64, 48, jnp.float32, 0),
    ('gpu', 512, 32, jnp.bfloat16, 0),  # groups of at most 256,
    ('gpu', 256, 128, jnp.float32, 0),  # tiles of at most 64 KiB.
    ('gpu', 256, 128, jnp.bfloat16, 1),
    ('tpu', 128, 48, jnp.float32, 1),
    ('tpu', 64, 32, jnp.float32, 0),  # Mosaic tiles the [n] mask by 128 rows.
    ('tpu', 512, 32, jnp.float32, 0),  # Fewer rows than one step.
    ('cpu', 64, 32, jnp.float32, 0),
])
def test_shapes_a_kernel_cannot_tile_take_the_xla_form(platform, group, dim,
                                                       dtype, calls):
  queries, rows, bias = _inputs(9, 8 * 384, dim, dtype)
  fn = functools.partial(group_maxima, group=group, platform=platform,
                         interpret=True)
  assert _kernel_calls(fn, queries, rows, bias) == calls


def test_queries_must_have_the_rows_dtype():
  queries, rows, bias = _inputs(2, 128, 16, jnp.float32)
  with pytest.raises(ValueError, match='float32 against rows of bfloat16'):
    group_maxima(queries, rows.astype(jnp.bfloat16), bias, 64, 'gpu')


@pytest.mark.parametrize('platform,program', [
    ('gpu', {}), ('tpu', {}),
    # 39 groups: 2 spans of 16 and one of 7; 9 queries in a block of 16.
    ('gpu', {'program_groups': 16, 'program_queries': 16}),
])
def test_exact_search_with_each_kernel_is_exact(platform, program,
                                                monkeypatch):
  """The whole search, the platform's kernel interpreted (on a TPU: 2 steps
  of 16 groups, 7 groups in the XLA form, 8 rows after the last group);
  each query's best rows excluded."""
  calls = []

  def interpreted(*args, **kwargs):
    calls.append(args[-1])
    return group_maxima(*args, **kwargs, interpret=True)
  monkeypatch.setattr(exact, 'group_maxima', interpreted)
  rng = np.random.default_rng(1)
  queries = rng.standard_normal((9, 32)).astype(np.float32)
  docs = rng.standard_normal((5000, 32)).astype(np.float32)
  truth = queries.astype(np.float64) @ docs.T.astype(np.float64)
  exclude = np.argsort(-truth, axis=1)[:, :2].astype(np.int32)
  np.put_along_axis(truth, exclude, -np.inf, axis=1)
  scores, ids = exact._exact_search(queries, docs, jnp.asarray(exclude), 8,
                                    Selection(method='fused', group=128,
                                              **program),
                                    platform)
  assert calls == [platform]
  expected = np.argsort(-truth, axis=1, kind='stable')[:, :8]
  np.testing.assert_array_equal(ids, expected)
  np.testing.assert_allclose(scores, np.take_along_axis(truth, expected, 1),
                             rtol=1e-5)


@pytest.mark.parametrize('program_groups', [1, 16])
def test_the_gpu_search_lowers_to_its_triton_kernel(program_groups):
  """The paper's search (13.35M x 128 bfloat16 rows, 512 queries, top 8)
  as the GPU runs it: lowered for CUDA on this machine, the Pallas kernel
  becomes Triton's IR (what Triton cannot express fails here; its compile
  to the card, and the card's limits, only on a GPU). The kernel writes
  the maxima queries-major, straight into the top-k over groups: a
  transposed [groups, Q] reached XLA:GPU's TopK kernel as a column-major
  bitcast, which it read as row-major (the wrong groups, on an H100). The
  card is named to the lowering (an abstract device): JAX 0.11's Pallas
  asks for one where no GPU is attached, where 0.10 assumed one."""
  args = (jax.ShapeDtypeStruct((512, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((13_353_718, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((512, 1), jnp.int32))
  h100 = aot.GPUS['h100']
  card = jax.sharding.AbstractMesh((1,), ('card',), abstract_device=(
      jax.sharding.AbstractDevice(device_kind=h100.device_kind,
                                  num_cores=h100.cores, platform='gpu')))
  with jax.sharding.use_abstract_mesh(card):
    lowered = exact._exact_search.trace(
        *args, 8, Selection(method='fused', group=256,
                            program_groups=program_groups), 'gpu').lower(
            lowering_platforms=('cuda',))
  text = lowered.as_text()
  calls = re.findall(r'custom_call @([\w$.]+)', text)
  assert calls == ['__gpu$xla.gpu.triton']
  kernel = re.search(r'(%\d+) = stablehlo.custom_call', text).group(1)
  assert f'chlo.top_k({kernel}, k = 9) : tensor<512x52162xf32>' in text


# XLA:GPU's compile of the paper's first stage for an H100, in a process
# that loads JAX's CUDA plugin before JAX starts; its PTX dumped.
GPU_COMPILE = """
import json, pathlib, re, shutil, subprocess, sys
from realm_jax import gpu_compiler
gpu_compiler.use()
import jax, jax.numpy as jnp
from realm_jax import aot
from realm_jax.index.group_maxima import group_maxima
one = jax.sharding.SingleDeviceSharding(aot.gpu_target('h100').devices[0])
rows = 13_353_718
args = [jax.ShapeDtypeStruct(shape, dtype, sharding=one) for shape, dtype in (
    ((512, 128), jnp.bfloat16), ((rows, 128), jnp.bfloat16),
    ((rows,), jnp.float32))]
found = {}
for program_groups, program_queries in ((1, 128), (16, 128), (16, 256)):
  name = f'{program_groups}x{program_queries}'
  dump = pathlib.Path(sys.argv[1]) / name
  compiled = jax.jit(lambda q, r, b: group_maxima(
      q, r, b, 128, 'gpu', program_groups=program_groups,
      program_queries=program_queries)).trace(*args).lower(
          lowering_platforms=('cuda',)).compile({'xla_dump_to': str(dump)})
  files = [f for f in dump.glob('*.ptx') if '.entry group_maxima' in
           f.read_text()]
  kernel = [f.read_text() for f in files]
  # Where CUDA's assembler is installed, what it makes of the kernel.
  assembled = [subprocess.run(
      [shutil.which('ptxas'), '-arch=sm_90a', '-v', str(f), '-o',
       str(f.with_suffix('.cubin'))], capture_output=True, text=True,
      check=True).stderr for f in files] if shutil.which('ptxas') else []
  found[name] = {
      'spilled': sum(int(n) for text in assembled
                     for n in re.findall(r'(\\d+) bytes spill', text)),
      'assembled': len(assembled),
      'kernels': len(kernel),
      'temp_bytes': compiled.memory_analysis().temp_size_in_bytes,
      'tensor_core': sum(text.count('wgmma.mma_async') for text in kernel),
      'local': sum(text.count('.local') for text in kernel),
      'async_copies': sum(text.count('cp.async') for text in kernel),
      'stores': sum(text.count('st.global') for text in kernel),
      'masked_stores': sum(len(re.findall(r'@%p\\d+ st.global', text))
                           for text in kernel)}
print(json.dumps(found))
"""


@pytest.mark.skipif(not gpu_compiler.installed(), reason="JAX's CUDA plugin "
                    'is not installed apart: `make gpu-compiler` installs it')
def test_xla_gpu_compiles_the_gpu_kernel_for_an_h100(tmp_path):
  """The paper's first stage compiled to PTX for an H100 (sm_90a) without
  one, for programs of 1 group and 128 queries, 16 and 128, 16 and 256: a
  Triton kernel on the tensor cores (wgmma), no local memory, nothing but
  the maxima written, and where CUDA's assembler is installed, nothing
  spilled. A program scoring 16 groups streams their rows into shared
  memory asynchronously, its queries loaded once (one group a program
  loads both with plain loads), and stores under a mask: the last
  program's block of 16 reaches past the table's 104,325 groups, and
  unmasked its last 11 columns would overwrite the next query's first
  groups."""
  process = subprocess.run(
      [sys.executable, '-c', GPU_COMPILE, str(tmp_path)], cwd=REPO,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True,
      text=True, timeout=300, check=False)
  assert process.returncode == 0, process.stderr
  found = json.loads(process.stdout.strip().splitlines()[-1])
  for program, kernel in found.items():
    assert kernel['kernels'] == 1, (program, kernel)
    assert kernel['tensor_core'] > 0 and kernel['local'] == 0, kernel
    assert kernel['temp_bytes'] == 0 and kernel['spilled'] == 0, kernel
    assert kernel['assembled'] in (0, 1), kernel
  assert found['1x128']['async_copies'] == 0
  for program in ('16x128', '16x256'):
    assert found[program]['async_copies'] > 0
    assert found[program]['stores'] == found[program]['masked_stores'] > 0


# Run in a process of its own: libtpu, once loaded, stays.
TPU_COMPILE = """
import json
import jax, jax.numpy as jnp
from realm_jax import aot, gpu_compiler
from realm_jax.index import exact
device = aot.tpu_target('v4:2x2x1').devices[0]
one = jax.sharding.SingleDeviceSharding(device)
args = [jax.ShapeDtypeStruct(shape, dtype, sharding=one) for shape, dtype in (
    ((512, 128), jnp.bfloat16), ((1 << 20, 128), jnp.bfloat16),
    ((512, 1), jnp.int32))]
# Mosaic reads the chip's tiling from the default device.
with jax.default_device(device):
  lowered = exact._exact_search.trace(
      *args, 8, exact.Selection(method='fused', group=256), 'tpu').lower()
  compiled = lowered.compile()
memory = compiled.memory_analysis()
print(json.dumps({'kernels': lowered.as_text().count('tpu_custom_call'),
                  'temp_bytes': memory.temp_size_in_bytes}))
"""


@pytest.mark.skipif(not os.path.exists(os.path.join(
    aot.libtpu_dir(), 'libtpu', 'libtpu.so')), reason='libtpu is not '
                    'installed apart: `make setup` installs it')
def test_xla_tpu_compiles_the_tpu_kernel():
  """1M bfloat16 rows for one TPU v4 chip: one Mosaic kernel, and
  temporaries (the best groups' rows gathered, 0.3 GB) a quarter of the
  [queries x rows] float32 scores (2 GiB) that are never written."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  process = subprocess.run([sys.executable, '-c', TPU_COMPILE], cwd=REPO,
                           env={**env, 'JAX_PLATFORMS': 'cpu'},
                           capture_output=True, text=True, timeout=300,
                           check=False)
  assert process.returncode == 0, process.stderr
  found = json.loads(process.stdout.strip().splitlines()[-1])
  assert found['kernels'] == 1
  assert 0 < found['temp_bytes'] < 2 ** 20 * 512 * 4 // 4, found
