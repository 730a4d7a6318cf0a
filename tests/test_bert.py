"""The Flax BERT: shapes, masking, logical axes, dtypes, remat, dropout, and
its layers scanned (one compiled body) or unrolled, which compute the same."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from realm_jax.models.attention import attend
from realm_jax.models import bert
from realm_jax.models.bert import Bert, BertConfig, mean_pool

pytestmark = pytest.mark.unit

LOGICAL_AXES = {'vocab', 'embed', 'length', 'token_type', 'heads', 'kv', 'mlp',
                'layers'}


def _inputs(config, batch=3, length=10, seed=0):
  rng = np.random.default_rng(seed)
  token_ids = rng.integers(1, config.vocab_size, (batch, length)).astype(np.int32)
  lengths = np.array([length, length - 3, 2][:batch])
  input_mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  token_type_ids = (np.arange(length)[None] >= 4).astype(np.int32).repeat(
      batch, 0)
  return token_ids * input_mask, input_mask, token_type_ids


def _init(config, inputs):
  return Bert(config).init(jax.random.key(0), *inputs)


@pytest.mark.parametrize('scan', [True, False])
def test_every_parameter_has_logical_axis_names(tiny_config, scan):
  config = dataclasses.replace(tiny_config, add_pooler=True, scan_layers=scan)
  boxed = jax.eval_shape(lambda: _init(config, _inputs(config)))['params']
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  # 16 per layer: stacked once under scan, once per layer unrolled.
  assert len(leaves) == 5 + 16 * (1 if scan else config.num_layers) + 2
  for leaf in leaves:
    assert isinstance(leaf, nn.Partitioned), leaf
    assert len(leaf.names) == leaf.value.ndim
    assert set(leaf.names) <= LOGICAL_AXES, leaf.names
  if scan:
    for leaf in jax.tree.leaves(boxed['layers'], is_leaf=lambda x: isinstance(
        x, nn.Partitioned)):
      assert leaf.names[0] == 'layers' and 'layers' not in leaf.names[1:]
      assert leaf.value.shape[0] == config.num_layers


def test_bert_base_has_the_published_parameter_count():
  # bert-base-uncased with its pooler: 109,482,240 parameters.
  config = BertConfig(add_pooler=True)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      _init(config, _inputs(config))))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == 109_482_240


def test_output_shapes(tiny_config):
  config = dataclasses.replace(tiny_config, add_pooler=True)
  inputs = _inputs(config)
  out = Bert(config).apply(_init(config, inputs), *inputs)
  assert out.sequence_output.shape == (3, 10, config.hidden_size)
  assert out.pooled_output.shape == (3, config.hidden_size)
  assert Bert(tiny_config).apply(_init(tiny_config, inputs),
                                 *inputs).pooled_output is None


def test_padding_does_not_change_real_positions(tiny_config):
  token_ids, input_mask, token_type_ids = _inputs(tiny_config)
  variables = _init(tiny_config, (token_ids, input_mask, token_type_ids))
  short = Bert(tiny_config).apply(variables, token_ids, input_mask,
                                  token_type_ids).sequence_output
  pad = lambda x, value: np.pad(x, ((0, 0), (0, 6)), constant_values=value)
  # Garbage token ids under the padding must not leak into real positions.
  long = Bert(tiny_config).apply(variables, pad(token_ids, 7),
                                 pad(input_mask, 0), pad(token_type_ids, 1)
                                 ).sequence_output
  real = input_mask.astype(bool)
  np.testing.assert_allclose(np.asarray(long[:, :10])[real],
                             np.asarray(short)[real], atol=1e-5)


@pytest.mark.parametrize('chunk', [1, 2, 4])
def test_attention_in_chunks_equals_one_shot_with_gradients(chunk):
  """The CPU loop over groups of sequences computes the same attention and
  gradients, also when the batch (5) is not a multiple of the group."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(5, 7, 3, 4)), jnp.float32)
             for _ in range(3))
  mask = jnp.asarray(np.arange(7)[None] < np.array([7, 5, 1, 7, 3])[:, None])

  def loss(q, k, v, chunk):
    out = attend(q, k, v, mask, jnp.float32, chunk=chunk)
    return jnp.sum(out * jnp.cos(out)), out

  (_, one_shot), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(
      q, k, v, 0)
  (_, chunked), chunk_grads = jax.value_and_grad(
      loss, (0, 1, 2), has_aux=True)(q, k, v, chunk)
  np.testing.assert_allclose(chunked, one_shot, atol=1e-6)
  for got, want in zip(chunk_grads, grads):
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_attention_chunk_of_the_config_picks_the_loop_or_the_one_shot_form(
    tiny_config):
  """0 compiles no loop even on CPU (what `aot` compiles for accelerators);
  the CPU default loops in a forward pass alone and not in training, whose
  backward pass the loop slows; all give the same encoder output."""
  inputs = _inputs(tiny_config)
  # Unrolled layers, no dropout: the only loop left is attention's, and
  # training's output is the forward pass's.
  unrolled = dataclasses.replace(tiny_config, scan_layers=False,
                                 dropout_rate=0.0, attention_dropout_rate=0.0)
  variables = _init(unrolled, inputs)

  def encode(config, deterministic):
    return lambda params: Bert(config).apply(
        {'params': params}, *inputs, deterministic=deterministic
    ).sequence_output

  outputs = []
  for chunk, deterministic, loops in ((0, True, False), (None, True, True),
                                      (None, False, False),
                                      (2, False, True)):
    config = dataclasses.replace(unrolled, attention_chunk=chunk)
    jaxpr = str(jax.make_jaxpr(encode(config, deterministic))(
        variables['params']))
    assert ('scan' in jaxpr) == loops, (chunk, deterministic)
    outputs.append(encode(config, deterministic)(variables['params']))
  for output in outputs[1:]:
    np.testing.assert_allclose(output, outputs[0], atol=1e-5)


def _loss(config, inputs):
  """Value and gradient of a fixed random read-out of the encoder (not of
  a sum of squares: after LayerNorm that is nearly constant, its gradient
  rounding noise)."""
  rng = np.random.default_rng(1)
  weights = rng.normal(size=inputs[0].shape + (config.hidden_size,))

  def loss(params):
    out = Bert(config).apply({'params': params}, *inputs)
    value = jnp.sum(out.sequence_output * weights)
    if out.pooled_output is not None:
      value += jnp.sum(out.pooled_output * weights[:, 0])
    return value, out

  value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
  return lambda params: (lambda r: (r[0][0], r[1], r[0][1]))(
      value_and_grad(params))


def test_scanned_layers_compute_what_the_unrolled_loop_does(tiny_config):
  """Stacking the unrolled layers' parameters on axis 0 gives the scanned
  model's: the same outputs and (stacked) gradients, float32, no dropout;
  and so does the scan unrolled whole (`scan_unroll`), which compiles no
  loop."""
  config = dataclasses.replace(tiny_config, num_layers=3, add_pooler=True,
                               attention_chunk=0)
  unrolled = dataclasses.replace(config, scan_layers=False)
  inputs = _inputs(config)
  params = nn.meta.unbox(_init(unrolled, inputs))['params']
  assert set(params) == {'embeddings', 'layer_0', 'layer_1', 'layer_2',
                         'pooler'}
  stacked = bert.stack_layers(params, config.num_layers)
  assert set(stacked) == {'embeddings', bert.LAYERS, 'pooler'}
  # The tree a scanned Bert initializes, filled with the unrolled weights.
  fresh = nn.meta.unbox(_init(config, inputs))['params']
  assert jax.tree.structure(fresh) == jax.tree.structure(stacked)
  jax.tree.map(lambda a, b: np.testing.assert_equal(a.shape, b.shape), fresh,
               stacked)

  value, grad, out = _loss(unrolled, inputs)(params)
  scanned_value, scanned_grad, scanned_out = _loss(config, inputs)(stacked)
  np.testing.assert_allclose(scanned_out.sequence_output, out.sequence_output,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(scanned_out.pooled_output, out.pooled_output,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(scanned_value, value, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                        atol=1e-5),
               scanned_grad, bert.stack_layers(grad))
  # The scan unrolled whole: the stacked layout, and no loop.
  whole = dataclasses.replace(config, scan_unroll=config.num_layers)
  whole_value, whole_grad, _ = _loss(whole, inputs)(stacked)
  np.testing.assert_allclose(whole_value, scanned_value, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                        atol=1e-5),
               whole_grad, scanned_grad)
  for looped, loops in ((config, True), (whole, False)):
    hlo = jax.jit(lambda p, c=looped: Bert(c).apply(
        {'params': p}, *inputs).sequence_output).lower(stacked).as_text()
    assert ('while' in hlo) == loops, looped.scan_unroll
  for bad in (0, True, 1.5):
    with pytest.raises(ValueError, match='scan_unroll'):
      dataclasses.replace(config, scan_unroll=bad)
  # And back: the inverse gives the unrolled tree itself.
  jax.tree.map(np.testing.assert_array_equal, bert.unstack_layers(stacked),
               params)
  assert bert.in_layout(params, config).keys() == stacked.keys()
  assert bert.in_layout(stacked, unrolled).keys() == params.keys()


def test_the_scanned_layers_compile_one_layer_body(tiny_config):
  """One scan of num_layers steps over one layer's parameters: the program
  holds one layer, not num_layers copies."""
  inputs = _inputs(tiny_config)
  config = dataclasses.replace(tiny_config, num_layers=4, attention_chunk=0)

  def program(config):
    params = nn.meta.unbox(_init(config, inputs))['params']
    return jax.make_jaxpr(lambda p: Bert(config).apply(
        {'params': p}, *inputs).sequence_output)(params)

  scanned = program(config)
  loops = [e for e in scanned.jaxpr.eqns if e.primitive.name == 'scan']
  assert len(loops) == 1 and loops[0].params['length'] == 4
  unrolled = program(dataclasses.replace(config, scan_layers=False))
  assert not any(e.primitive.name == 'scan' for e in unrolled.jaxpr.eqns)
  assert len(str(scanned)) < len(str(unrolled)) / 2


def test_stack_layers_needs_every_layer(tiny_config):
  unrolled = dataclasses.replace(tiny_config, scan_layers=False)
  params = nn.meta.unbox(_init(unrolled, _inputs(unrolled)))['params']
  with pytest.raises(ValueError, match='layer_0 ... layer_2'):
    bert.stack_layers(params, 3)


@pytest.mark.parametrize('scan', [True, False])
@pytest.mark.parametrize('remat', ['full', 'dots'])
def test_remat_gives_the_same_outputs_and_gradients(tiny_config, remat, scan):
  config = dataclasses.replace(tiny_config, scan_layers=scan)
  inputs = _inputs(config)
  params = _init(config, inputs)['params']
  plain, plain_grad, _ = _loss(config, inputs)(params)
  remat_config = dataclasses.replace(config, remat=remat)
  remat, remat_grad, _ = _loss(remat_config, inputs)(params)
  np.testing.assert_allclose(remat, plain, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                        atol=1e-5),
               remat_grad, plain_grad)


def test_remat_policy_names_and_older_configs_booleans(tiny_config):
  assert dataclasses.replace(tiny_config, remat=True).remat == 'full'
  assert dataclasses.replace(tiny_config, remat=False).remat == 'none'
  with pytest.raises(ValueError, match="remat='some'"):
    dataclasses.replace(tiny_config, remat='some')


def test_dots_remat_saves_the_projections_full_saves_none(tiny_config):
  """What the backward pass keeps of a layer: 'full' only its input, 'dots'
  the outputs of its batch-free matmuls too (recomputing fewer)."""
  unrolled = dataclasses.replace(tiny_config, scan_layers=False)
  inputs = _inputs(unrolled)
  params = _init(unrolled, inputs)['params']

  def saved(remat):
    config = dataclasses.replace(unrolled, remat=remat)
    loss = lambda p: jnp.sum(Bert(config).apply({'params': p},
                                                *inputs).sequence_output)
    _, backward = jax.vjp(loss, params)  # Holds what it saved.
    return sum(x.size for x in jax.tree.leaves(backward))

  assert saved('full') < saved('dots') < saved('none')


def test_scanned_bf16_layers_keep_no_float32_copy_of_the_stream(tiny_config):
  """Under scan, whatever a layer keeps for the backward pass is stacked
  over the layers. The LayerNorms and the activation are recomputed from
  their inputs, so no float32 tensor of the residual stream's size (the
  LayerNorms' centred and normalized inputs) is kept, and of the feed-
  forward width only the activation's input: its output, which the second
  product's kernel gradient reads, is recomputed (`Dense.input_activation`)."""
  config = dataclasses.replace(tiny_config, dtype='bfloat16', remat='none',
                               dropout_rate=0.0, attention_dropout_rate=0.0)
  inputs = _inputs(config)
  params = _init(config, inputs)['params']
  loss = lambda p: jnp.sum(Bert(config).apply(
      {'params': p}, *inputs).sequence_output.astype(jnp.float32))
  _, backward = jax.vjp(loss, params)  # Holds what it saved.
  batch, length = inputs[0].shape
  stacked = [x for x in jax.tree.leaves(backward)
             if x.shape[:3] == (config.num_layers, batch, length)]
  hidden = [x for x in stacked if x.shape[3:] == (config.hidden_size,)]
  width = [x for x in stacked if x.shape[3:] == (config.intermediate_size,)]
  assert hidden and all(x.dtype == jnp.bfloat16 for x in hidden)
  assert len(width) == 1, [x.dtype for x in width]


@pytest.mark.parametrize('act', ['gelu', 'gelu_new'])
@pytest.mark.parametrize('forward_only_gpu', [False, True])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_a_dense_layer_of_its_activated_input_has_the_plain_gradients(
    tiny_config, act, forward_only_gpu, dtype):
  """Dense(input_activation=True) is the dense layer of activation(x), its
  values and its gradients (of x, the kernel and the bias) in their dtypes
  (a float32 kernel's gradient float32 under bfloat16 compute), though the
  backward pass recomputes the activation instead of keeping it; in the
  epilogue form too."""
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  config = dataclasses.replace(tiny_config, hidden_act=act, dtype=dtype)
  x = jax.random.normal(jax.random.key(1), (3, 5, 24)).astype(dtype)
  names = ('mlp', 'embed')
  activated = bert.dense(config, 16, names, 'out', input_activation=True)
  plain = bert.dense(config, 16, names, 'out')
  variables = jax.tree.map(
      lambda v: v + 0.01 * jnp.arange(v.size).reshape(v.shape),
      nn.meta.unbox(plain.init(jax.random.key(0), x)))
  activation = bert.ACTIVATIONS[act]

  def grads(apply):
    return jax.value_and_grad(lambda v, x: jnp.sum(jnp.sin(apply(v, x))),
                              argnums=(0, 1))(variables, x)
  with target.compiling_for('cpu' if not forward_only_gpu else 'gpu',
                            forward_only=forward_only_gpu):
    ours = grads(activated.apply)
    reference = grads(lambda v, x: plain.apply(v, activation(x)))
  assert (jax.tree.map(lambda a: a.dtype, ours)
          == jax.tree.map(lambda a: a.dtype, reference))
  assert jax.tree.leaves(ours[1][0])[0].dtype == jnp.float32  # Parameters.
  tolerance = 1e-5 if dtype == 'float32' else 1e-2
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance,
      atol=tolerance), ours, reference)


def test_recomputed_layer_norm_and_activation_have_plain_gradients(
    tiny_config):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5, 32)),
                  jnp.float32)
  recomputed = bert.layer_norm(tiny_config, 'ln')
  plain = nn.LayerNorm(epsilon=tiny_config.layer_norm_eps, name='ln')
  variables = plain.init(jax.random.key(0), x)
  variables = jax.tree.map(lambda v: v + 0.1 * jnp.arange(v.size), variables)

  def grads(module):
    return jax.grad(lambda v, x: jnp.sum(jnp.sin(module.apply(v, x))),
                    argnums=(0, 1))(variables, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                        atol=1e-6),
               grads(recomputed), grads(plain))
  for act in ('gelu', 'gelu_new'):  # Against JAX's own GELU.
    config = dataclasses.replace(tiny_config, hidden_act=act)
    reference = functools.partial(jax.nn.gelu, approximate=act == 'gelu_new')
    np.testing.assert_allclose(
        jax.grad(lambda x: jnp.sum(jnp.sin(config.activation(x))))(x),
        jax.grad(lambda x: jnp.sum(jnp.sin(reference(x))))(x),
        rtol=1e-5, atol=1e-6)
  # The exact GELU in bfloat16 as in float32, rounded, down to -4.5; beyond
  # it, where 1 + erf cancels in float32 (as PyTorch's does), within 1e-6.
  exact = dataclasses.replace(tiny_config, hidden_act='gelu').activation
  for low, high, tolerance in ((-4.5, 6, {'rtol': 1e-2, 'atol': 1e-7}),
                              (-8, -4.5, {'rtol': 0, 'atol': 1e-6})):
    wide = jnp.linspace(low, high, 61, dtype=jnp.bfloat16)
    np.testing.assert_allclose(
        np.asarray(exact(wide), np.float32),
        np.asarray(jax.nn.gelu(wide.astype(jnp.float32), approximate=False
                               ).astype(jnp.bfloat16), np.float32),
        **tolerance)


def test_the_exact_gelu_is_jaxs_erfc_form_on_a_tpu():
  """XLA:TPU runs out of vector memory fusing erf's float32 polynomial into
  a product (the paper-scale step on a v4): there the exact GELU is JAX's.
  Elsewhere it is erf's, which XLA:GPU computes in one pass."""
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  x = jnp.ones((4,), jnp.bfloat16)
  # A new function each time: a traced one is cached, whatever the target.
  traced = lambda: str(jax.make_jaxpr(lambda v: bert.exact_gelu(v))(x))
  assert ' erf ' in traced() and 'erfc' not in traced()
  with target.compiling_for('tpu'):
    assert 'erfc' in traced()


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('features,in_axes', [((4, 8), 1), ((16,), 2)])
def test_the_bias_in_cublas_epilogue_form_is_the_same_projection(
    tiny_config, dtype, features, in_axes):
  """A forward-only GPU program adds a projection's bias in the product's
  dtype over one output axis (`target.bias_in_epilogue`): the same
  parameters, and the same values up to bfloat16's rounding of the bias
  and of the sum."""
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  config = dataclasses.replace(tiny_config, dtype=dtype)
  names = ('embed', 'heads', 'kv')[:in_axes + len(features)]
  dense = bert.Dense(config, features, names, in_axes)
  shape = (3, 5, 4, 4) if in_axes == 2 else (3, 5, 16)
  x = jax.random.normal(jax.random.key(1), shape)
  # Every bias entry its own value: a misplaced one shows.
  variables = jax.tree.map(
      lambda v: v + 0.01 * jnp.arange(v.size).reshape(v.shape),
      nn.meta.unbox(dense.init(jax.random.key(0), x)))
  outputs, added_in = {}, {}
  for forward_only in (False, True):
    with target.compiling_for('gpu', forward_only=forward_only):
      assert target.bias_in_epilogue() == forward_only
      outputs[forward_only] = dense.apply(variables, x)
      jaxpr = jax.make_jaxpr(dense.apply)(variables, x).jaxpr
    added_in[forward_only] = {str(v.aval.dtype) for e in jaxpr.eqns
                              if e.primitive.name == 'add' for v in e.invars}
  assert not target.bias_in_epilogue()
  # cuBLAS adds a bias of the product's dtype; the plain form, in float32.
  assert added_in == {False: {'float32'}, True: {dtype}}
  plain, epilogue = outputs[False], outputs[True]
  assert plain.shape == epilogue.shape == (3, 5) + features
  assert plain.dtype == epilogue.dtype == jnp.dtype(dtype)
  # bfloat16: the bias rounded to it, and the sum rounded before the cast.
  tolerance = 1e-6 if dtype == 'float32' else 2 ** -7
  np.testing.assert_allclose(np.asarray(epilogue, np.float32),
                             np.asarray(plain, np.float32),
                             rtol=tolerance, atol=tolerance)


def test_only_forward_only_gpu_programs_take_cublas_products():
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  assert target.compiler_options('gpu', forward_only=True) == {
      'xla_gpu_enable_triton_gemm': False}
  for platform, forward_only in (('gpu', False), ('cpu', True),
                                 ('tpu', True)):
    assert target.compiler_options(platform, forward_only) is None
    with target.compiling_for(platform, forward_only=forward_only):
      assert not target.bias_in_epilogue()


def test_bf16_compute_keeps_fp32_params(tiny_config):
  inputs = _inputs(tiny_config)
  bf16 = dataclasses.replace(tiny_config, dtype='bfloat16')
  variables = nn.meta.unbox(_init(bf16, inputs))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables))
  low = Bert(bf16).apply(variables, *inputs).sequence_output
  high = Bert(tiny_config).apply(variables, *inputs).sequence_output
  assert low.dtype == jnp.bfloat16 and high.dtype == jnp.float32
  # Post-LN activations are O(1); bf16 keeps ~3 significant digits.
  np.testing.assert_allclose(np.asarray(low, np.float32), high, atol=0.1)


def test_dropout_is_active_only_when_training(tiny_config):
  inputs = _inputs(tiny_config)
  variables = _init(tiny_config, inputs)
  model = Bert(tiny_config)
  eval_a = model.apply(variables, *inputs).sequence_output
  eval_b = model.apply(variables, *inputs).sequence_output
  train = model.apply(variables, *inputs, deterministic=False,
                      rngs={'dropout': jax.random.key(1)}).sequence_output
  np.testing.assert_array_equal(eval_a, eval_b)
  assert not np.allclose(train, eval_a, atol=1e-3)


def test_sequence_longer_than_position_table_is_an_error(tiny_config):
  inputs = _inputs(tiny_config, length=tiny_config.max_position_embeddings + 1)
  with pytest.raises(ValueError, match='max_position_embeddings'):
    _init(tiny_config, inputs)


def test_heads_must_divide_hidden_size():
  with pytest.raises(ValueError, match='num_heads=5'):
    BertConfig(hidden_size=32, num_heads=5)


def test_mean_pool_averages_real_tokens_only():
  hidden = jnp.arange(2 * 3 * 2, dtype=jnp.float32).reshape(2, 3, 2)
  mask = jnp.array([[1, 1, 0], [1, 0, 0]])
  np.testing.assert_allclose(mean_pool(hidden, mask),
                             [[1.0, 2.0], [6.0, 7.0]])


def test_hidden_act_picks_exact_or_tanh_gelu(tiny_config):
  """'gelu' is erf's GELU (Hugging Face's BERT), 'gelu_new' the tanh
  approximation of Google's BERT code, which the released REALM uses."""
  x = np.linspace(-4, 4, 41, dtype=np.float32)
  erf = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
  tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                (x + 0.044715 * x ** 3)))
  exact = BertConfig(hidden_act='gelu').activation(jnp.asarray(x))
  approximate = BertConfig(hidden_act='gelu_new').activation(jnp.asarray(x))
  np.testing.assert_allclose(exact, erf, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(approximate, tanh, rtol=1e-5, atol=1e-6)
  assert np.max(np.abs(erf - tanh)) > 1e-4  # The two differ.
  # The choice reaches the feed-forward layers (near 0, where the small
  # initial weights keep them, the two agree to ~1e-7).
  inputs = _inputs(tiny_config)
  params = _init(tiny_config, inputs)
  outputs = [Bert(dataclasses.replace(tiny_config, hidden_act=act)).apply(
      params, *inputs).sequence_output for act in ('gelu', 'gelu_new')]
  assert not np.array_equal(outputs[0], outputs[1])
  with pytest.raises(ValueError, match="hidden_act='relu'"):
    BertConfig(hidden_act='relu')


def test_a_warm_start_source_takes_the_layout_of_the_model_it_starts():
  """A run trained with either scan_layers warm-starts a model of the
  other: its BERTs are stacked or unrolled to match, values unchanged."""
  from realm_jax import run_directory  # pylint: disable=g-import-not-at-top
  unrolled = {'embeddings': {'w': np.ones(2)},
              'layer_0': {'k': np.zeros((2, 3))},
              'layer_1': {'k': np.ones((2, 3))}}
  stacked = bert.stack_layers(unrolled)
  head = {'bias': np.ones(4)}
  scanned = run_directory.in_layout_of({'bert': unrolled, 'head': head},
                                       {'bert': stacked, 'head': head})
  assert sorted(scanned['bert']) == ['embeddings', 'layers']
  np.testing.assert_array_equal(scanned['bert']['layers']['k'],
                                stacked['layers']['k'])
  back = run_directory.in_layout_of(scanned, {'bert': unrolled, 'head': head})
  assert sorted(back['bert']) == ['embeddings', 'layer_0', 'layer_1']
  np.testing.assert_array_equal(back['bert']['layer_1']['k'], 1)
