"""`realm-jax aot`: the abstract inputs are what `prepare` gives, the lowered
step is the step that trains, and the memory and FLOPs it reports follow
the shardings."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from realm_jax import aot
from realm_jax.training import input_pipeline, partitioning, run_kinds
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
  preparer = run.batch_preparer(str(tmp_path), trainer.mesh)
  preparer.start(state.params, 0)
  examples = next(input_pipeline.batches(run.task, 'train', run.shapes,
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
  examples = next(input_pipeline.batches(run.task, 'train', run.shapes, 8))
  inputs, _ = run.batch_preparer(str(tmp_path), None).prepare(
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
    np.testing.assert_allclose(got, (parts[0] + parts[1]) / 2, rtol=1e-4,
                               atol=1e-6)

