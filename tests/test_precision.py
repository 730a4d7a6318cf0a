"""The mixed-precision policy (gin/setups/bf16.gin): bfloat16 products and
activations over float32 parameters, bounded against float32."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import train_step
from realm_jax.models import bert
from realm_jax.training import run_loader

pytestmark = pytest.mark.unit

SPEC = 'bqh,hk->bqk'
# The tiny model's REALM step at small shapes: 2 candidates, short reads.
SMALL = ('Pretrain.num_candidates = 2', 'Pretrain.query_length = 32',
         'Pretrain.max_masked = 4', 'build_realm.reader_length = 96',
         'Pretrain.block_length = 64')


def _operands():
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32),
          jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
          jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32))


def test_contract_in_float32_is_einsum_with_its_gradients():
  a, b, w = _operands()
  ours = lambda a, b: jnp.sum(bert.contract(SPEC, a, b, jnp.float32) * w)
  einsum = lambda a, b: jnp.sum(jnp.einsum(SPEC, a, b) * w)
  np.testing.assert_allclose(ours(a, b), einsum(a, b), rtol=1e-6)
  for got, want in zip(jax.grad(ours, (0, 1))(a, b),
                       jax.grad(einsum, (0, 1))(a, b)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_contract_in_bfloat16_rounds_operands_and_accumulates_in_float32():
  """The product of the bfloat16-rounded operands, summed in float32; the
  gradients come back in the operands' dtype, within bfloat16's rounding."""
  a, b, w = _operands()
  out = bert.contract(SPEC, a, b, jnp.bfloat16)
  assert out.dtype == jnp.float32
  rounded = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_allclose(out, jnp.einsum(SPEC, rounded(a), rounded(b)),
                             rtol=1e-5, atol=1e-5)
  loss = lambda a, b, dtype: jnp.sum(bert.contract(SPEC, a, b, dtype) * w)
  low = jax.grad(loss, (0, 1))(a, b, jnp.bfloat16)
  high = jax.grad(loss, (0, 1))(a, b, jnp.float32)
  for got, want in zip(low, high):
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)
    assert not np.array_equal(got, want)  # bfloat16 did round something.


def test_the_bf16_setup_selects_the_policy():
  gin.clear_config()
  run_loader.configure(['gin/runs/pretrain.gin', 'gin/models/tiny.gin',
                        'gin/setups/bf16.gin'], ["Pretrain.bert_dir = ''"])
  try:
    config = bert.BertConfig()
    assert (config.dtype, config.param_dtype) == (jnp.bfloat16, jnp.float32)
  finally:
    gin.clear_config()


@pytest.mark.slow
def test_realm_training_in_bfloat16_stays_near_float32():
  """Ten REALM pre-training steps of the tiny model from the same parameters
  on the same batch, at a learning rate that moves them: the losses agree
  to 2% at every step, both fall by a tenth, and
  the parameters and the optimizer state stay float32."""
  losses, states = {}, {}
  params = None
  for dtype in ('float32', 'bfloat16'):
    trainer, state, inputs, _ = train_step.build(
        'pretrain', 'tiny', 4, dtype, SMALL + ('bert_adamw.learning_rate = 1e-3',))
    if params is None:  # On the host: the step donates the state's buffers.
      params = jax.device_get(state.params)
    state = trainer.initial_state(params)
    losses[dtype] = []
    for _ in range(10):
      state, metrics = trainer.step(state, inputs)
      losses[dtype].append(float(metrics['loss']))
    states[dtype] = state
    gin.clear_config()
  assert trainer.objective.model.reader_config.dtype == jnp.bfloat16
  high, low = np.array(losses['float32']), np.array(losses['bfloat16'])
  assert np.all(np.isfinite(low))
  np.testing.assert_allclose(low, high, rtol=0.02)
  assert low[-1] < low[0] * 0.9 and high[-1] < high[0] * 0.9
  leaves = jax.tree.leaves(states['bfloat16'].params) + [
      x for x in jax.tree.leaves(states['bfloat16'].opt_state)
      if hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jnp.floating)]
  assert {x.dtype for x in leaves} == {np.dtype('float32')}
