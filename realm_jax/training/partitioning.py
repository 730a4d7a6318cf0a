"""The trainer's device mesh and every sharding of its state and batches.

(The index builder's embedding step and exact search run on 1-D meshes of
their own devices: `embed.DocumentEmbedder` and `exact.index_mesh`.) A 2-D
mesh ('data', 'model'): the batch is split over 'data'; attention heads,
feed-forward units and the vocabulary are split over 'model' (Megatron-style).
The Flax modules name their axes logically (batch, length, embed, heads, kv,
mlp, vocab, layers, ...); `LOGICAL_AXIS_RULES` maps those names onto mesh axes, and a
name without a rule is replicated.
"""

import gin
import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

LOGICAL_AXIS_RULES = (
    ('batch', 'data'),
    # The stacked layers of a scanned BERT (bert.LAYERS): every device holds
    # every layer, each sharded along its other axes.
    ('layers', None),
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


def state_shardings(abstract_state, param_shardings, mesh: Mesh):
  """Shardings of a train state: every leaf whose trailing dict-key path is a
  parameter's path (Adam's moments, params themselves) shares that
  parameter's sharding; the rest (step counts, rng) is replicated."""
  by_path = {tuple(k.key for k in path): sharding for path, sharding in
             jax.tree_util.tree_leaves_with_path(param_shardings)}

  def sharding_of(path, leaf):
    keys = []
    for entry in reversed(path):
      if not isinstance(entry, jax.tree_util.DictKey):
        break
      keys.insert(0, entry.key)
    sharding = by_path.get(tuple(keys))
    if sharding is not None and len(sharding.spec) <= leaf.ndim:
      return sharding
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(sharding_of, abstract_state)


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows of the batch -> global arrays sharded over 'data'."""
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(
          batch_sharding(mesh), x), local_batch)


def local_rows(global_array, mesh: Mesh):
  """The rows of a 'data'-sharded global array that this process fed."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.global_array_to_host_local_array(
      global_array, mesh, P('data')))
