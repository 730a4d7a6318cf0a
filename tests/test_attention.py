"""Each target's attention kernel against the reference formula.

cuDNN's kernel runs only on a GPU: its call is checked here with the same
arguments through `implementation='xla'`, which pins the lengths and the
scale it is given. The splash kernel runs in Pallas's interpreter on CPU:
the same kernel code as on a TPU, padding and gradients included.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import attention, products, target
from realm_jax.models.bert import Bert

pytestmark = pytest.mark.unit

BATCH, LENGTH, HEADS, HEAD_DIM = 3, 40, 2, 64
# Right-padded rows: whole, cut short, and one real token.
LENGTHS = np.array([LENGTH, 17, 1])


def _qkv_and_mask():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(BATCH, LENGTH, HEADS, HEAD_DIM)),
                         jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(LENGTH)[None] < LENGTHS[:, None], jnp.int32)
  return q, k, v, mask


KERNELS = {
    'cudnn': lambda q, k, v, m: attention._cudnn(q, k, v, m, jnp.bfloat16,
                                                 implementation='xla'),
    'splash': lambda q, k, v, m: attention._splash(q, k, v, m, jnp.bfloat16,
                                                   interpret=True),
    'chunked': lambda q, k, v, m: attention._chunked(q, k, v, m,
                                                     jnp.bfloat16, 2),
}


def _real(x, mask):
  return np.asarray(x, np.float32)[np.asarray(mask).astype(bool)]


@pytest.mark.parametrize('kernel', sorted(KERNELS))
def test_kernel_equals_the_reference_in_bfloat16_with_padding(kernel):
  q, k, v, mask = _qkv_and_mask()
  want = attention.reference(q, k, v, mask, jnp.bfloat16)
  got = KERNELS[kernel](q, k, v, mask)
  assert got.shape == want.shape and got.dtype == jnp.bfloat16
  # bfloat16 keeps 8 bits: outputs of size ~1 agree to a few of its steps.
  np.testing.assert_allclose(_real(got, mask), _real(want, mask), atol=3e-2)
  # Padding keys are not attended: scrambling them leaves real rows alone.
  scramble = lambda x: jnp.where(mask[:, :, None, None].astype(bool), x,
                                 100.0)
  again = KERNELS[kernel](q, scramble(k), scramble(v), mask)
  np.testing.assert_allclose(_real(again, mask), _real(got, mask), atol=3e-2)


@pytest.mark.parametrize('kernel', sorted(KERNELS))
def test_kernel_gradients_equal_the_reference(kernel):
  q, k, v, mask = _qkv_and_mask()
  weight = mask[:, :, None, None].astype(jnp.float32)

  def loss(fn):
    return lambda q, k, v: jnp.sum(
        jnp.cos(fn(q, k, v, mask).astype(jnp.float32)) * weight)

  reference = lambda q, k, v, m: attention.reference(q, k, v, m,
                                                     jnp.bfloat16)
  want = jax.grad(loss(reference), (0, 1, 2))(q, k, v)
  got = jax.grad(loss(KERNELS[kernel]), (0, 1, 2))(q, k, v)
  for g, w in zip(got, want):
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w),
                               atol=0.02 * scale)


def test_a_wrong_kernel_would_fail_these_tolerances():
  """The tolerance above separates a right kernel from a near miss: the
  scale off by the head dimension's square root fails it."""
  q, k, v, mask = _qkv_and_mask()
  want = attention.reference(q, k, v, mask, jnp.bfloat16)
  wrong = attention.reference(q * HEAD_DIM ** 0.25, k, v, mask, jnp.bfloat16)
  assert np.abs(_real(wrong, mask) - _real(want, mask)).max() > 3e-2


@pytest.mark.parametrize('platform,dtype,dropout,expected', [
    ('cpu', jnp.bfloat16, False, 'xla'),
    ('gpu', jnp.bfloat16, False, 'cudnn'),
    ('gpu', jnp.float32, False, 'xla'),  # cuDNN takes 16-bit operands.
    ('gpu', jnp.bfloat16, True, 'xla'),  # It drops no probabilities.
    ('tpu', jnp.bfloat16, False, 'splash'),
    ('tpu', jnp.float32, False, 'splash'),
    ('tpu', jnp.bfloat16, True, 'xla'),
])
def test_the_target_picks_the_kernel(platform, dtype, dropout, expected):
  with target.compiling_for(platform):
    assert attention.choose(None, dtype, dropout) == expected


def test_a_fused_kernel_asked_for_with_dropout_is_refused():
  with pytest.raises(ValueError, match='attention_dropout_rate'):
    attention.choose('cudnn', jnp.bfloat16, dropout_active=True)
  with pytest.raises(ValueError, match='attention_implementation'):
    attention.choose('flash', jnp.bfloat16, dropout_active=False)


def test_products_return_the_compute_dtype_on_accelerators_only():
  a = jnp.ones((4, 8), jnp.float32)
  b = jnp.ones((8, 3), jnp.float32)
  for platform, want in (('cpu', jnp.float32), ('gpu', jnp.bfloat16),
                         ('tpu', jnp.bfloat16)):
    with target.compiling_for(platform):
      assert products.contract('ij,jk->ik', a, b, jnp.bfloat16).dtype == want
      # Scores a softmax reads stay float32 everywhere.
      assert products.contract('ij,jk->ik', a, b, jnp.bfloat16,
                               jnp.float32).dtype == jnp.float32
      # A float32 operand's gradient is its float32 sum.
      grads = jax.grad(lambda a, b: jnp.sum(products.contract(
          'ij,jk->ik', a, b, jnp.bfloat16).astype(jnp.float32)), (0, 1))(a, b)
      assert all(g.dtype == jnp.float32 for g in grads)
      np.testing.assert_allclose(grads[1], 4.0)


def test_the_target_is_the_tracing_devices_not_the_host():
  """A jitted function traced under `compiling_for('tpu')` builds the TPU
  program (the splash kernel's custom call) although it runs on CPU."""
  q, k, v, mask = _qkv_and_mask()

  def call(platform):
    with target.compiling_for(platform):
      return str(jax.make_jaxpr(lambda *a: attention.attend(
          *a, jnp.bfloat16))(q, k, v, mask))

  assert 'pallas_call' in call('tpu')
  assert 'pallas_call' not in call('cpu')
  assert target.target_platform() == 'cpu'


@pytest.mark.slow
@pytest.mark.parametrize('implementation', ['splash', 'cudnn'])
def test_bert_with_a_fused_kernel_equals_xla_on_real_tokens(
    tiny_config, implementation):
  """The whole encoder, bf16, on right-padded rows."""
  config = dataclasses.replace(tiny_config, dtype='bfloat16')
  rng = np.random.default_rng(1)
  token_ids = jnp.asarray(rng.integers(1, config.vocab_size, (2, 24)))
  mask = jnp.asarray(np.arange(24)[None] < np.array([24, 9])[:, None],
                     jnp.int32)
  params = Bert(config).init(jax.random.PRNGKey(0), token_ids, mask)

  def encode(config):
    return Bert(config).apply(params, token_ids, mask).sequence_output

  want = encode(dataclasses.replace(config, attention_implementation='xla'))
  # On CPU cuDNN's call runs through XLA and splash in the interpreter.
  got = encode(dataclasses.replace(config,
                                   attention_implementation=implementation))
  np.testing.assert_allclose(_real(got, mask), _real(want, mask), atol=0.1)


def test_splash_on_a_mesh_runs_per_shard_and_equals_the_reference():
  """A Mosaic kernel is not partitioned automatically: on a mesh, splash
  runs under shard_map, batch over 'data' and heads over 'model'."""
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  mesh = partitioning.make_mesh(data=2, model=2, devices=jax.devices()[:4])
  q, k, v, mask = _qkv_and_mask()
  q, k, v, mask = (x[:2] for x in (q, k, v, mask))  # 2 rows over 'data'.

  def fused(q, k, v, mask):
    with target.compiling_for('cpu', mesh):
      return attention.attend(q, k, v, mask, jnp.bfloat16,
                              implementation='splash')

  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  got = jax.jit(fused, in_shardings=rows)(q, k, v, mask)
  assert 'shard_map' in str(jax.make_jaxpr(fused)(q, k, v, mask))
  want = attention.reference(q, k, v, mask, jnp.bfloat16)
  np.testing.assert_allclose(_real(got, mask), _real(want, mask), atol=3e-2)
