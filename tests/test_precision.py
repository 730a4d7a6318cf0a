"""The mixed-precision policy (gin/setups/bf16.gin): bfloat16 products and
activations over float32 parameters, bounded against float32."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import train_step
from realm_jax.models import bert, products
from realm_jax.training import run_loader

pytestmark = pytest.mark.unit

# The model's forms: a dense layer over two input axes (its backward sums
# over the leading axes), attention scores (batched), and a plain product.
SPECS = {'...ab,abw->...w': ((2, 5, 4, 8), (4, 8, 6), (2, 5, 6)),
         'bqhd,bkhd->bhqk': ((2, 5, 4, 8), (2, 3, 4, 8), (2, 4, 5, 3)),
         'bqh,hk->bqk': ((2, 5, 16), (16, 8), (2, 5, 8))}
# The tiny model's REALM step at small shapes: 2 candidates, short reads.
SMALL = ('Pretrain.num_candidates = 2', 'Pretrain.query_length = 32',
         'Pretrain.max_masked = 4', 'build_realm.reader_length = 96',
         'Pretrain.block_length = 64')


def _operands(shapes):
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes]


@pytest.mark.parametrize('spec', SPECS)
def test_contract_in_float32_is_einsum_with_its_gradients(spec):
  a, b, w = _operands(SPECS[spec])
  ours = lambda a, b: jnp.sum(products.contract(spec, a, b, jnp.float32) * w)
  einsum = lambda a, b: jnp.sum(jnp.einsum(spec, a, b) * w)
  np.testing.assert_allclose(ours(a, b), einsum(a, b), rtol=1e-5)
  for got, want in zip(jax.grad(ours, (0, 1))(a, b),
                       jax.grad(einsum, (0, 1))(a, b)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('spec', SPECS)
def test_contract_in_bfloat16_sums_rounded_operands_in_float32(spec):
  """Forward and backward: the float32 sums of bfloat16-rounded operands
  and cotangent; float32 operands get float32 gradients, not rounded to
  bfloat16 on the way, bfloat16 operands bfloat16 ones."""
  a, b, w = _operands(SPECS[spec])
  rounded = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
  exact = lambda s, x, y: jnp.einsum(s, x, y,
                                     precision=jax.lax.Precision.HIGHEST)
  out = products.contract(spec, a, b, jnp.bfloat16)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, exact(spec, rounded(a), rounded(b)),
                             rtol=1e-5, atol=1e-5)
  operands, result = spec.split('->')
  a_spec, b_spec = operands.split(',')
  loss = lambda a, b: jnp.sum(products.contract(spec, a, b, jnp.bfloat16) * w)
  grad_a, grad_b = jax.grad(loss, (0, 1))(a, b)
  assert grad_a.dtype == grad_b.dtype == jnp.float32
  np.testing.assert_allclose(
      grad_a, exact(f'{result},{b_spec}->{a_spec}', rounded(w), rounded(b)),
      rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      grad_b, exact(f'{a_spec},{result}->{b_spec}', rounded(a), rounded(w)),
      rtol=1e-5, atol=1e-5)
  # A bfloat16 activation's gradient comes back in bfloat16.
  low = jax.grad(loss)(a.astype(jnp.bfloat16), b)
  assert low.dtype == jnp.bfloat16


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
