"""`realm-jax aot`: the abstract inputs are what `prepare` gives, the lowered
step is the step that trains, and the memory and FLOPs it reports follow
the shardings; `--target=tpu:...` compiles with XLA:TPU from the libtpu
installed apart, which nothing else sees; `--target=gpu:...` with XLA:GPU
from JAX's CUDA plugin installed apart, without a GPU."""

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from realm_jax import aot, errors, gpu_compiler, main
from realm_jax.input.seqio_source import SeqioSource
from realm_jax.training import partitioning, run_kinds
from realm_jax.training.trainer import Trainer
from tests.helpers import REPO, TINY, bind_tiny

pytestmark = [pytest.mark.integration,
              pytest.mark.usefixtures('small_corpus_env')]


def _shapes(tree):
  return jax.tree.map(lambda x: (tuple(x.shape), np.dtype(x.dtype)), tree)


def _prepared(tmp_path, batch_size: int):
  """A tiny pre-training Trainer on 4 devices, its state, and one batch."""
  bind_tiny()
  run = run_kinds.Pretrain(num_candidates=4, query_length=32, bert_dir='')
  trainer = Trainer(run.objective,
                    partitioning.make_mesh(devices=jax.devices()[:4]), 10)
  state = trainer.initial_state()
  preparer = run.input_preparer(str(tmp_path), trainer.mesh)
  preparer.start(state.params, 0)
  examples = next(SeqioSource().batches(run.task, 'train', run.shapes,
                                         batch_size))
  inputs, _ = preparer.prepare(examples, state.params, 0)
  return trainer, state, inputs


def test_lowered_step_is_the_step_and_its_inputs_are_what_prepare_gives(
    tmp_path):
  trainer, state, inputs = _prepared(tmp_path, 8)
  block_length = inputs['candidates']['token_ids'].shape[-1]
  abstract = trainer.objective.abstract_inputs(8, block_length)
  assert _shapes(abstract) == _shapes(inputs)

  compiled = trainer.lower(abstract).compile()
  global_inputs = partitioning.global_batch(inputs, trainer.mesh)
  copy = jax.tree.map(lambda x: x.copy(), state)  # Both steps donate it.
  _, metrics = compiled(copy, global_inputs)
  _, expected = trainer.step(state, inputs)
  np.testing.assert_allclose(metrics['loss'], expected['loss'], rtol=1e-6)


def test_ict_abstract_inputs_are_what_prepare_gives(tmp_path):
  run = run_kinds.Ict(query_length=16, block_length=64, bert_dir='')
  examples = next(SeqioSource().batches(run.task, 'train', run.shapes, 8))
  inputs, _ = run.input_preparer(str(tmp_path), None).prepare(
      examples, None, 0)
  assert _shapes(run.objective.abstract_inputs(8, 288)) == _shapes(inputs)


def test_memory_follows_the_shardings():
  """8 trainer devices, 4 builder devices; the index is split 4 ways."""
  bind_tiny('build_realm.reader_length = 64')
  programs = aot.compile_and_fit(run_kinds.Pretrain(bert_dir=''), 8, 10, 8,
                                 builder_devices=4, num_blocks=10_000,
                                 block_length=32, embed_batch_size=64,
                                 search_queries=16, search_k=8,
                                 search_dtype='float32')
  train, embed, search = programs
  assert [p.devices for p in programs] == [8, 4, 4]
  for p in programs:
    assert p.total_bytes == (p.argument_bytes + p.output_bytes + p.temp_bytes
                             - p.alias_bytes) > 0
    assert p.flops > 0
  # The donated train state comes back in place.
  assert train.alias_bytes > 0
  # One device holds a quarter of the 10,000 x 16 float32 index (plus the
  # queries and excluded ids), not all of it.
  quarter = 2_500 * 16 * 4
  assert quarter <= search.argument_bytes < quarter + 4096
  assert search.flops == 2 * 16 * 2_500 * 16
  assert embed.argument_bytes > 0


def test_matmul_flops_count_every_loop_trip_and_every_device():
  """A scan's body counts `length` times (XLA's cost analysis counts it
  once), a shard_map's body once per device, a cond's costliest branch;
  a Pallas kernel is counted as a call, its FLOPs unknown."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  w = jax.ShapeDtypeStruct((12, 64, 32), np.float32)
  x = jax.ShapeDtypeStruct((8, 64), np.float32)
  product = 2 * 8 * 64 * 32  # [8, 64] @ [64, 32]

  def layers(w, x):
    step = lambda c, wi: (c + (c @ wi) @ wi.T, None)
    return jax.lax.scan(step, x, w)[0]

  flops, kernels = aot.matmul_flops(jax.make_jaxpr(layers)(w, x))
  assert (flops, kernels) == (12 * 2 * product, 0)
  grads = jax.make_jaxpr(jax.grad(lambda w, x: layers(w, x).sum()))(w, x)
  assert aot.matmul_flops(grads)[0] == 3 * 12 * 2 * product

  mesh = jax.make_mesh((4,), ('data',), (jax.sharding.AxisType.Explicit,),
                       devices=jax.devices()[:4])
  split = jax.jit(jax.shard_map(lambda x, v: x @ v, mesh=mesh,
                                in_specs=(P('data'), P()), out_specs=P('data')))
  sharded = jax.ShapeDtypeStruct((8, 64), np.float32,
                                 sharding=NamedSharding(mesh, P('data')))
  assert aot.matmul_flops(jax.make_jaxpr(split)(
      sharded, jax.ShapeDtypeStruct((64, 32), np.float32)))[0] == product

  branches = lambda p, x, v: jax.lax.cond(p, lambda: (x @ v) @ v.T,
                                          lambda: x)
  assert aot.matmul_flops(jax.make_jaxpr(branches)(
      True, x, jax.ShapeDtypeStruct((64, 32), np.float32)))[0] == 2 * product

  def copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  kernel = pl.pallas_call(copy, out_shape=x, interpret=True)
  assert aot.matmul_flops(jax.make_jaxpr(
      lambda x, v: kernel(x) @ v)(x, jax.ShapeDtypeStruct(
          (64, 32), np.float32))) == (product, 1)


def test_too_few_devices_is_a_clear_error():
  bind_tiny()
  with pytest.raises(ValueError, match='xla_force_host_platform_device_count'
                     '=64'):
    aot.compile_and_fit(run_kinds.Pretrain(bert_dir=''), 8, 10, 64)


@pytest.mark.slow
def test_command_fakes_the_mesh_writes_json_and_fails_what_does_not_fit(
    tmp_path):
  output = tmp_path / 'aot.json'
  process = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'aot', '--mesh=8',
       '--builder_mesh=4', f'--output={output}',
       '--device_memory_gib=0.01', *TINY, "--gin.Pretrain.bert_dir=''",
       '--gin.compile_and_fit.num_blocks=1000',
       '--gin.compile_and_fit.block_length=32',
       '--gin.compile_and_fit.embed_batch_size=64'],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'XLA_FLAGS': ''}, check=False)
  assert process.returncode != 0, process.stdout
  assert 'Does not fit in 0.01 GiB per device: train step' in process.stderr
  assert ('| train step (Pretrain) | 8 | batch 8 in 1 microbatch(es) |'
          in process.stdout)
  report = json.loads(output.read_text())
  assert [p['devices'] for p in report['programs']] == [8, 4, 4]


@pytest.mark.slow
def test_microbatches_average_the_slices_losses_and_gradients(tmp_path):
  """M = 2: the step's gradients are the mean of each slice's (rows m,
  m + 2, ...; dropout key fold_in(rng, m)), computed on their own."""
  trainer, state, inputs = _prepared(tmp_path, 16)
  rng = jax.random.PRNGKey(5)
  trainer.microbatches = 2
  metrics, grads = jax.jit(trainer.gradients)(
      state.params, partitioning.global_batch(inputs, trainer.mesh), rng)
  pieces = [jax.jit(trainer.loss_and_grads)(
      state.params, jax.tree.map(lambda x, m=m: x[m::2], inputs),
      jax.random.fold_in(rng, m)) for m in range(2)]
  np.testing.assert_allclose(
      metrics['loss'], (pieces[0][0][1]['loss'] + pieces[1][0][1]['loss']) / 2,
      rtol=1e-5)
  for got, *parts in zip(jax.tree.leaves(grads), jax.tree.leaves(pieces[0][1]),
                         jax.tree.leaves(pieces[1][1])):
    mean = (parts[0] + parts[1]) / 2
    # Float32 sums in another order: seen off by 1e-4 of the leaf's largest
    # entry (an entry near 0), where a wrong slice or dropout key is off by
    # the entries' own size. A leaf whose gradient is 0 (the attention key's
    # bias) holds only rounding, 1e-13.
    np.testing.assert_allclose(
        got, mean, rtol=1e-4,
        atol=max(1e-6, 1e-3 * float(np.max(np.abs(mean)))))



# The TPU compile needs libtpu where `make setup` installs it, apart from
# the environment: skipped, saying so, only where it is not there.
LIBTPU_APART = os.path.join(aot.libtpu_dir(), 'libtpu', 'libtpu.so')
needs_libtpu = pytest.mark.skipif(
    not os.path.isfile(LIBTPU_APART),
    reason=f'libtpu is not installed apart ({LIBTPU_APART}): `make setup` '
    f"installs it (pip install --no-deps --target {aot.libtpu_dir()} "
    f"'{aot.LIBTPU}').")
# The tiny model's programs, small enough to compile in seconds.
TINY_AOT = [*TINY, "--gin.Pretrain.bert_dir=''",
            '--gin.compile_and_fit.num_blocks=1000',
            '--gin.compile_and_fit.block_length=32',
            '--gin.compile_and_fit.embed_batch_size=64']


def test_the_libtpu_installed_is_the_one_jax_pins():
  """The Makefile's libtpu is aot's, and the one jax's own tpu extra pins
  for this jaxlib (`libtpu==0.0.42.*`)."""
  makefile = (pathlib.Path(REPO) / 'Makefile').read_text()
  assert f'--target $(VENV)/libtpu {aot.LIBTPU}' in makefile
  pins = [r.split(';')[0].replace(' ', '') for r in
          importlib.metadata.requires('jax') if r.startswith('libtpu')]
  assert len(pins) == 1
  pinned = pins[0].removeprefix('libtpu==')
  assert aot.LIBTPU.removeprefix('libtpu==').startswith(
      pinned.removesuffix('*'))


def test_the_environment_does_not_see_libtpu():
  """A plain process of this environment (every command but the TPU
  compile) neither imports libtpu nor starts JAX's TPU backend."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('TPU_')}
  env.pop('JAX_PLATFORMS', None)
  process = subprocess.run(
      [sys.executable, '-c', 'import jax\n'
       'print(jax.default_backend())\n'
       'import libtpu'], env=env, capture_output=True, text=True,
      timeout=120, check=False)
  assert process.returncode == 1, process.stdout
  assert process.stdout.strip() != 'tpu'
  assert "No module named 'libtpu'" in process.stderr
  assert 'TPU' not in process.stderr.replace("'libtpu'", '')


@pytest.mark.parametrize('name, kind, dims', [
    ('v4:4x4x4', 'v4', (4, 4, 4)), ('v4:2x2x1', 'v4', (2, 2, 1)),
    ('v5e:2x2', 'v5e', (2, 2, 1)), ('v5p:2x2x1', 'v5p', (2, 2, 1)),
    ('v6e:16x16', 'v6e', (16, 16, 1))])
def test_topology_names_give_the_chip_and_its_shape(name, kind, dims):
  chip, shape = aot._topology(name)  # pylint: disable=protected-access
  assert (chip.kind, shape) == (kind, dims)


@pytest.mark.parametrize('name', ['v3:2x2x1', 'v4', 'v4:2x2x1x2', 'v4:axb',
                                  '2x2x1'])
def test_other_topology_names_are_a_clear_error(name):
  with pytest.raises(errors.BadConfig, match='chip one of v4, v5e, v5p, v6e'):
    aot._topology(name)  # pylint: disable=protected-access


@pytest.mark.parametrize('target, where, message, pin', [
    ('tpu:v4:2x2x1', aot.LIBTPU_DIR_ENV, 'Compiling for a TPU needs libtpu, '
     'which is not in {}: `make setup` installs it there, or `pip install',
     aot.LIBTPU),
    ('gpu:h100', gpu_compiler.DIR_ENV, 'Compiling for a GPU without one needs '
     "JAX's CUDA plugin, which is not in {}: `make gpu-compiler` installs it "
     'there, or `pip install', gpu_compiler.PINS[0])])
def test_without_its_compiler_a_target_says_how_to_install_it(
    target, where, message, pin, tmp_path, monkeypatch, capsys):
  """One line, exit code 2, before any gin is read."""
  monkeypatch.setenv(where, str(tmp_path / 'nowhere'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')  # The command sets it.
  assert main.main(['aot', f'--target={target}', *TINY_AOT]) == 2
  error = capsys.readouterr().err.strip()
  assert len(error.splitlines()) == 1
  assert error.startswith(
      'realm-jax aot: ' + message.format(tmp_path / 'nowhere'))
  assert pin in error


# What the test below runs in a process of its own: libtpu, once loaded,
# stays (200 MB and its threads), and this worker runs other tests next.
TOPOLOGY_DEVICES = """
import json, os
import jax
from realm_jax import aot
from realm_jax.training import partitioning
jax.devices()  # This process's backends start first, without libtpu.
before = dict(os.environ)
target = aot.tpu_target('v4:2x2x1')
mesh = partitioning.make_mesh(devices=target.devices)
print(json.dumps({
    'environment_kept': dict(os.environ) == before,
    'devices': sorted({(d.platform, d.device_kind) for d in target.devices}),
    'count': len(target.devices), 'description': target.description,
    'mesh': dict(mesh.shape), 'backend': jax.default_backend()}))
"""


@needs_libtpu
def test_tpu_topology_devices_make_the_trainers_mesh():
  """libtpu's devices of a v4 slice, one per chip: the trainer's mesh takes
  them, the process's own backend stays the CPU, and the environment is
  left as it was (for the processes this one starts)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('TPU_')}
  process = subprocess.run([sys.executable, '-c', TOPOLOGY_DEVICES],
                           cwd=REPO, env={**env, 'JAX_PLATFORMS': 'cpu'},
                           capture_output=True, text=True, timeout=300,
                           check=False)
  assert process.returncode == 0, process.stderr
  found = json.loads(process.stdout.strip().splitlines()[-1])
  assert found['environment_kept']
  assert (found['devices'], found['count']) == ([['tpu', 'TPU v4']], 4)
  assert found['description'].startswith('XLA:TPU (libtpu 0.0.42')
  assert found['description'].endswith('), TPU v4')
  assert found['mesh'] == {'data': 4, 'model': 1}
  assert found['backend'] == 'cpu'


def _aot_in_a_process(tmp_path, target: str):
  """`realm-jax aot --target=TARGET` on the tiny model in a process of its
  own (a compiler's plugin, once loaded, stays): the finished process and
  its JSON's path."""
  output = tmp_path / 'aot.json'
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  process = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'aot', f'--target={target}',
       f'--output={output}', *TINY_AOT],
      cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
      check=False)
  assert process.returncode == 0, process.stderr
  return process, output


@needs_libtpu
@pytest.mark.slow
def test_command_compiles_for_a_tpu_slice_with_xla_tpu(tmp_path):
  """`realm-jax aot --target=tpu:v4:2x2x1`: the tiny model's three programs
  compiled by XLA:TPU for the 4 chips of a v4-8, each inside one chip's
  32 GiB, with FLOPs, and the train step's time at 40% MFU."""
  process, output = _aot_in_a_process(tmp_path, 'tpu:v4:2x2x1')
  assert ('Per chip, compiled by XLA:TPU (libtpu 0.0.42.1) for TPU v4 '
          '(topology v4:2x2x1, 4 chips; 32 GiB HBM, 275 TFLOP/s bf16 peak)'
          in process.stdout)
  assert '| train step (Pretrain) | 4 | batch 8 in 1 microbatch(es) |' in (
      process.stdout)
  report = json.loads(output.read_text())
  assert (report['target'], report['device'], report['mesh'],
          report['builder_mesh']) == ('tpu:v4:2x2x1', 'TPU v4', 4, 4)
  assert report['chip'] == {'kind': 'v4', 'hbm_gib': 32,
                            'peak_bf16_tflops': 275}
  assert report['device_memory_gib'] == 32
  train, embed, search = report['programs']
  for p in report['programs']:
    assert p['compiled_by'] == 'XLA:TPU (libtpu 0.0.42.1), TPU v4'
    assert p['devices'] == 4
    assert 0 < p['total_bytes'] < 32 * aot.GIB
    assert p['flops'] > 0 and p['xla_flops'] > 0
    assert p['compile_seconds'] > 0
  assert train['alias_bytes'] > 0  # The donated state, in place.
  assert train['seconds_at_mfu'] == pytest.approx(
      train['flops'] / (0.4 * 275e12))
  assert embed['seconds_at_mfu'] is None
  # A quarter of the 1,000 x 16 bfloat16 index per chip.
  assert search['argument_bytes'] >= 250 * 16 * 2


needs_xla_cuda = pytest.mark.skipif(
    not gpu_compiler.installed(),
    reason=f"JAX's CUDA plugin is not installed apart "
    f'({gpu_compiler.directory()}): `make gpu-compiler` installs it.')


def test_the_cuda_plugin_make_installs_is_for_this_jaxlib():
  """`make gpu-compiler` installs aot's pins, the plugin at jaxlib's own
  version (JAX refuses a plugin of another)."""
  makefile = (pathlib.Path(REPO) / 'Makefile').read_text()
  recipe = makefile.split('gpu-compiler: setup')[1].split('\n\n')[0]
  assert ('--target $(VENV)/xla-cuda' in recipe
          and all(pin in recipe for pin in gpu_compiler.PINS))
  assert f'jax-cuda13-plugin=={importlib.metadata.version("jaxlib")}' in (
      gpu_compiler.PINS)


@pytest.mark.parametrize('name', ['a100', 'h100x', 'h100x0', 'h100:8', 'x8',
                                  'H100'])
def test_other_gpu_names_are_a_clear_error(name, monkeypatch):
  monkeypatch.setattr(gpu_compiler, 'use', lambda: pytest.fail('loaded'))
  with pytest.raises(errors.BadConfig, match='card one of h100, h200'):
    aot.gpu_target(name)
  assert gpu_compiler.parse('h200x8') == ('h200', 8)
  assert set(gpu_compiler.CARDS) == set(aot.GPUS)


@needs_xla_cuda
@pytest.mark.slow
def test_command_compiles_for_an_h100_with_xla_gpu(tmp_path):
  """`realm-jax aot --target=gpu:h100x2`: the tiny model's three programs
  compiled by XLA:GPU for two H100s, each inside one's memory."""
  process, output = _aot_in_a_process(tmp_path, 'gpu:h100x2')
  assert 'Traceback' not in process.stderr, process.stderr
  assert ('Per device, compiled by XLA:GPU (jax-cuda13-plugin 0.10.2, no '
          'GPU: nothing autotuned) for NVIDIA H100 80GB HBM3, against 79.1 '
          'GiB:' in process.stdout)
  report = json.loads(output.read_text())
  assert (report['target'], report['mesh'], report['builder_mesh'],
          report['gpu']['kind']) == ('gpu:h100x2', 2, 2, 'h100')
  for p in report['programs']:
    assert p['devices'] == 2
    assert 0 < p['total_bytes'] < 79.1 * aot.GIB
    assert p['flops'] > 0 and p['xla_flops'] is None


@needs_xla_cuda
def test_the_gpu_targets_train_step_attends_with_cudnn():
  """The trace is the GPU's program (`target.compiling_for` from the
  mesh's devices), though this process runs on its CPU. The corpus
  embedding, forward only, takes cuBLAS's products with the bias in their
  epilogue (`target.compiler_options`); the train step keeps XLA's default,
  Triton's."""
  process = subprocess.run(
      [sys.executable, '-c', GPU_STEP_TEXT], cwd=REPO,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True,
      text=True, timeout=600, check=False)
  assert process.returncode == 0, process.stderr
  found = json.loads(process.stdout.strip().splitlines()[-1])
  assert found['backend'] == 'cpu'
  assert found['cudnn_attention'] > 0
  assert found['device_kind'] == 'NVIDIA H100 80GB HBM3'
  assert found['train_triton_products'] > 0
  assert found['embed_triton_products'] == 0
  # The bias in the epilogue of the attention's output projection, both
  # feed-forward products and the final projection (the scan's body counted
  # once; at these tiny sizes XLA merges q, k and v into one product, whose
  # bias it leaves apart). Added in float32, only the last would be.
  assert found['embed_cublas_with_bias'] >= 4


GPU_STEP_TEXT = """
import json
from realm_jax import gpu_compiler
gpu_compiler.use()  # Before JAX starts.
import jax
jax.devices()  # This process's own backends start, on its CPU.
from realm_jax import aot
from realm_jax.training import partitioning, run_kinds
from realm_jax.training.trainer import Trainer
from tests.helpers import bind_tiny
bind_tiny('BertConfig.dtype = "bfloat16"',
          'BertConfig.attention_dropout_rate = 0.0')
target = aot.gpu_target('h100')
run = run_kinds.Pretrain(num_candidates=4, query_length=32, bert_dir='')
trainer = Trainer(run.objective,
                  partitioning.make_mesh(devices=target.devices), 10)
text = trainer.lower(run.objective.abstract_inputs(8, 32)).compile().as_text()
from realm_jax.index.embed import DocumentEmbedder
from realm_jax.models.realm import model_retriever
embedder = DocumentEmbedder(model_retriever(), 8, target.devices[:1])
embed = embedder.lower(aot._unsharded(trainer.abstract_state.params[
    'retriever']), 32).compile().as_text()
cublas = [line for line in embed.splitlines()
          if 'custom_call_target="__cublas$lt$matmul"' in line]
print(json.dumps({'backend': jax.default_backend(),
                  'cudnn_attention': text.count('__cudnn$fmha'),
                  'device_kind': target.devices[0].device_kind,
                  'train_triton_products': text.count('gemm_fusion_dot'),
                  'embed_triton_products': embed.count('gemm_fusion_dot'),
                  'embed_cublas_with_bias': sum(
                      '"epilogue":"BIAS"' in line for line in cublas)}))
"""
