"""`realm-jax aot`: proof, before anyone pays for a pod, that a configuration
compiles and fits on its target mesh.

Three programs are lowered with abstract inputs (`jax.ShapeDtypeStruct`, so
nothing is allocated) and compiled for a mesh of faked CPU devices of the
target size:
  - the trainer's step (the gin-configured run, e.g. REALM pre-training);
  - the index builder's embedding step (the document tower);
  - exact search of a batch of queries over every block, split row-wise.
XLA's memory analysis of each compiled program gives the bytes one device
holds (arguments + outputs + temporaries - donated aliases), its cost
analysis the FLOPs one device runs. These are the CPU compiler's figures for
the same partitioned program: TPU buffer assignment and fusion differ, so
treat a fit within a few GiB of the limit as unproven.
"""

import dataclasses

import gin
import jax
import numpy as np

from realm_jax.index.embed import DocumentEmbedder
from realm_jax.index.exact import AXIS, index_mesh, sharded_top_k
from realm_jax.models.realm import model_retriever
from realm_jax.training import partitioning
from realm_jax.training.run_kinds import RunKind
from realm_jax.training.trainer import Trainer

GIB = 2 ** 30


@dataclasses.dataclass
class Program:
  """One compiled program's per-device figures."""
  name: str
  devices: int
  shape: str  # What one call processes.
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  flops: float  # Per device, per call.

  @property
  def total_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes + self.temp_bytes
            - self.alias_bytes)

  def as_dict(self) -> dict:
    return {**dataclasses.asdict(self), 'total_bytes': self.total_bytes}


def _analyse(name: str, devices: int, shape: str, lowered,
             flops: float | None = None, loop_trips: int = 1) -> Program:
  """Compiles `lowered`. XLA counts a loop's body once: `loop_trips`
  scales its count (microbatches; the optimizer update, a few FLOPs per
  parameter, is then counted that many times too), or `flops` replaces
  it."""
  compiled = lowered.compile()
  memory = compiled.memory_analysis()
  if flops is None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # Older JAX: one dict per program.
      cost = cost[0]
    flops = float(cost.get('flops', 0.0)) * loop_trips
  return Program(name, devices, shape, memory.argument_size_in_bytes,
                 memory.output_size_in_bytes, memory.temp_size_in_bytes,
                 memory.alias_size_in_bytes, flops)


def _unsharded(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@gin.configurable
def compile_and_fit(run: RunKind, batch_size: int, num_steps: int,
                    mesh_devices: int, builder_devices: int = 16,
                    num_blocks: int = 13_353_718, block_length: int = 288,
                    embed_batch_size: int = 1024, search_queries: int = 512,
                    search_k: int = 8, search_dtype: str = 'bfloat16',
                    search_chunk_size: int = 65536) -> list[Program]:
  """Compiles the train step on `mesh_devices` devices and the builder's
  embedding step and exact search on `builder_devices`; returns each one's
  per-device memory and FLOPs.

  Args:
    run / batch_size / num_steps: what `train` would train (see
      `run_loader.configured_run`).
    mesh_devices: the trainer's devices (make_mesh's data x model).
    builder_devices: the index builder's devices.
    num_blocks / block_length: the knowledge corpus (13,353,718 blocks of at
      most 288 wordpieces in the paper).
    embed_batch_size: blocks per embedding step, over all builder devices.
    search_queries / search_k: one search call (a batch of queries, top-k).
    search_dtype: the index embeddings' dtype.
    search_chunk_size: rows scored at a time per device.
  """
  devices = jax.devices()
  needed = max(mesh_devices, builder_devices)
  if len(devices) < needed:
    raise ValueError(f'{needed} devices needed, {len(devices)} present: set '
                     'XLA_FLAGS=--xla_force_host_platform_device_count='
                     f'{needed} before JAX starts (`realm-jax aot` does).')
  mesh = partitioning.make_mesh(devices=devices[:mesh_devices])
  trainer = Trainer(run.objective, mesh, num_steps)
  train_step = _analyse(
      f'train step ({type(run).__name__})', mesh_devices,
      f'batch {batch_size} in {trainer.microbatches} microbatch(es)',
      trainer.lower(run.objective.abstract_inputs(batch_size, block_length)),
      loop_trips=trainer.microbatches)

  embedder_retriever = model_retriever()
  embedder = DocumentEmbedder(embedder_retriever, embed_batch_size,
                              devices[:builder_devices])
  embed_step = _analyse(
      'embed step', builder_devices,
      f'{embed_batch_size} blocks x {block_length}',
      embedder.lower(_unsharded(trainer.abstract_state.params['retriever']),
                     block_length))

  search_mesh = index_mesh(devices[:builder_devices])
  rows = -(-num_blocks // builder_devices) * builder_devices
  dim = embedder_retriever.projection_size
  replicated = jax.sharding.NamedSharding(search_mesh,
                                          jax.sharding.PartitionSpec())
  split = jax.sharding.NamedSharding(search_mesh,
                                     jax.sharding.PartitionSpec(AXIS))
  search = sharded_top_k(search_mesh, num_blocks, search_k, search_chunk_size)
  exact_search = _analyse(
      'exact search', builder_devices,
      f'{search_queries} queries, top-{search_k} of {num_blocks:,} x {dim} '
      f'{search_dtype}',
      flops=2.0 * search_queries * (rows // builder_devices) * dim,
      lowered=search.lower(
          jax.ShapeDtypeStruct((search_queries, dim), search_dtype,
                               sharding=replicated),
          jax.ShapeDtypeStruct((rows, dim), search_dtype, sharding=split),
          jax.ShapeDtypeStruct((rows,), bool, sharding=split),
          jax.ShapeDtypeStruct((search_queries, 1), np.int32,
                               sharding=replicated)))
  return [train_step, embed_step, exact_search]


def table(programs: list[Program], device_memory_gib: float) -> str:
  """A markdown table of the figures against one device's memory."""
  lines = ['| program | devices | one call | arguments | outputs | temporaries '
           '| total per device | fits in '
           f'{device_memory_gib:g} GiB | GFLOP per device |',
           '|---|---|---|---|---|---|---|---|---|']
  for p in programs:
    gib = lambda b: f'{b / GIB:.2f} GiB'
    lines.append(
        f'| {p.name} | {p.devices} | {p.shape} | {gib(p.argument_bytes)} | '
        f'{gib(p.output_bytes)} | {gib(p.temp_bytes)} | '
        f'{gib(p.total_bytes)} | '
        f'{"yes" if p.total_bytes < device_memory_gib * GIB else "NO"} | '
        f'{p.flops / 1e9:,.1f} |')
  return '\n'.join(lines)
