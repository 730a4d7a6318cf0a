"""One table of logical axis rules shards every parameter and the batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from realm_jax.models.bert import Bert
from realm_jax.training import partitioning

pytestmark = pytest.mark.unit


def test_mesh_shape_and_errors():
  mesh = partitioning.make_mesh(model=2)
  assert dict(mesh.shape) == {'data': 4, 'model': 2}
  with pytest.raises(ValueError, match='data=3 x model=2'):
    partitioning.make_mesh(data=3, model=2)


@pytest.mark.parametrize('scan', [True, False])
def test_rules_shard_heads_mlp_and_vocab_over_model(tiny_config, scan):
  """The stacked layers' leading axis ('layers', under scan) is not
  sharded; their other axes are, as the unrolled layers' are."""
  config = dataclasses.replace(tiny_config, scan_layers=scan)
  mesh = partitioning.make_mesh(data=4, model=2)
  ids = jnp.ones((8, 6), jnp.int32)
  abstract = jax.eval_shape(lambda: Bert(config).init(
      jax.random.key(0), ids, ids))['params']
  shardings = partitioning.logical_shardings(abstract, mesh)
  layer = shardings['layers' if scan else 'layer_0']
  lead = (None,) if scan else ()
  assert layer['attention']['query']['kernel'].spec == P(
      *lead, None, 'model', None)
  assert layer['attention']['out']['kernel'].spec == P(
      *lead, 'model', None, None)
  assert layer['intermediate']['kernel'].spec == P(*lead, None, 'model')
  assert layer['output']['kernel'].spec == P(*lead, 'model', None)
  assert layer['output_layer_norm']['scale'].spec == P(*lead, None)
  assert shardings['embeddings']['word_embeddings']['embedding'].spec == P(
      'model', None)
  assert shardings['embeddings']['layer_norm']['scale'].spec == P(None)
  assert partitioning.batch_sharding(mesh).spec == P('data')


def test_sharded_forward_equals_single_device(tiny_config):
  mesh = partitioning.make_mesh(data=4, model=2)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, tiny_config.vocab_size, (8, 6)).astype(np.int32)
  mask = np.ones_like(ids)
  model = Bert(tiny_config)
  boxed = model.init(jax.random.key(0), ids, mask)['params']
  params = nn.meta.unbox(boxed)
  expected = model.apply({'params': params}, ids, mask).sequence_output
  shardings = partitioning.logical_shardings(
      jax.eval_shape(lambda: boxed), mesh)
  batch = partitioning.batch_sharding(mesh)

  @jax.jit
  def forward(params, ids, mask):
    with nn.logical_axis_rules(partitioning.LOGICAL_AXIS_RULES):
      return model.apply({'params': params}, ids, mask).sequence_output

  with jax.set_mesh(mesh):
    got = forward(jax.device_put(params, shardings),
                  jax.device_put(ids, batch), jax.device_put(mask, batch))
  np.testing.assert_allclose(got, expected, atol=1e-5)
  assert got.sharding.spec[0] == 'data'
