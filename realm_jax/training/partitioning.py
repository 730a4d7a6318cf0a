"""The one place that builds the device mesh and every sharding.

A 2-D mesh ('data', 'model'): the batch is split over 'data'; attention heads,
feed-forward units and the vocabulary are split over 'model' (Megatron-style).
The Flax modules name their axes logically (batch, length, embed, heads, kv,
mlp, vocab, ...); `LOGICAL_AXIS_RULES` maps those names onto mesh axes, and a
name without a rule is replicated.
"""

import gin
import jax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

LOGICAL_AXIS_RULES = (
    ('batch', 'data'),
    ('heads', 'model'),
    ('mlp', 'model'),
    ('vocab', 'model'),
)


@gin.configurable
def make_mesh(data: int = -1, model: int = 1, devices=None) -> Mesh:
  """A ('data', 'model') mesh; data=-1 takes every device `model` leaves."""
  devices = list(devices if devices is not None else jax.devices())
  if data == -1:
    data = len(devices) // model
  if data * model != len(devices):
    raise ValueError(f'make_mesh: data={data} x model={model} != '
                     f'{len(devices)} devices.')
  # Auto axes: XLA's partitioner places the collectives the shardings imply.
  return jax.make_mesh((data, model), ('data', 'model'),
                       (jax.sharding.AxisType.Auto,) * 2, devices=devices)


def logical_shardings(abstract_boxed, mesh: Mesh,
                      rules=LOGICAL_AXIS_RULES):
  """NamedShardings for a tree of `nn.Partitioned` leaves (jax.eval_shape of
  a module's init); unannotated leaves are replicated."""
  specs = nn.get_partition_spec(abstract_boxed)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis over 'data', the rest replicated."""
  return NamedSharding(mesh, P('data'))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
