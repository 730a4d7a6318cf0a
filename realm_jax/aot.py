"""`realm-jax aot`: proof, before anyone pays for a pod, that a configuration
compiles and fits on its target mesh.

Three programs are lowered with abstract inputs (`jax.ShapeDtypeStruct`, so
nothing is allocated) and compiled for the target's devices:
  - the trainer's step (the gin-configured run, e.g. REALM pre-training);
  - the index builder's embedding step (the document tower);
  - exact search of a batch of queries over every block, split row-wise.
XLA's memory analysis of each compiled program gives the bytes one device
holds (arguments + outputs + temporaries - donated aliases). The FLOPs one
device runs are counted in the traced program's matrix products
(`matmul_flops`), every loop trip included; XLA's cost analysis, which
counts a loop's body once (BERT's layers run in one), is reported beside.

Three targets:
  - 'cpu' (`cpu_target`): a mesh of faked CPU devices, compiled by XLA:CPU.
    The same partitioned program, but TPU buffer assignment and fusion
    differ, so treat a fit within a few GiB of the limit as unproven.
  - 'tpu:<topology>' (`tpu_target`), e.g. 'tpu:v4:4x4x4': the devices of a
    TPU slice described by libtpu, compiled by XLA:TPU itself, on any
    machine: no TPU is needed, only libtpu. libtpu lives apart from the
    environment (`make setup` puts it in .venv/libtpu; `LIBTPU_DIR_ENV`
    names another place), since a libtpu that `import jax` finds slows every
    command's start and prints TPU warnings. Only this compile loads it.
  - 'gpu:<card>[x<count>]' (`gpu_target`), e.g. 'gpu:h100': NVIDIA GPUs
    described by their facts (`GPUS`), compiled by XLA:GPU from JAX's CUDA
    plugin without a GPU (nothing is autotuned: the kernels XLA fuses and
    the memory it assigns are the card's, the products' tile choices may
    not be). The plugin and cuDNN live apart too (realm_jax/gpu_compiler.py)
    and load in this compile only.
"""

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import math
import os
import re
import sys
import time

import gin
from etils import epath
import jax
import jax.extend
import numpy as np

from realm_jax import errors, extras, gpu_compiler
from realm_jax.index.embed import DocumentEmbedder
from realm_jax.index.exact import AXIS, index_mesh, sharded_top_k
from realm_jax.models.realm import model_retriever
from realm_jax.training import partitioning
from realm_jax.training.run_kinds import RunKind
from realm_jax.training.trainer import Trainer

GIB = 2 ** 30
# The libtpu that jax's own `tpu` extra pins for this jaxlib (0.10.2); the
# Makefile's setup recipe installs the same one apart.
LIBTPU = 'libtpu==0.0.42.1'
# A directory holding the libtpu package (`pip install --target DIR`), if
# not <sys.prefix>/libtpu, where `make setup` puts it.
LIBTPU_DIR_ENV = 'REALM_JAX_LIBTPU'
# The model FLOPs utilization the step time is quoted at (the paper-style
# estimate: a step's FLOPs per chip / (MFU x the chip's peak)).
MFU = 0.4


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU chip kind: its topology prefix, its name as JAX's devices give
  it, its HBM and its dense bfloat16 peak."""
  kind: str
  device_kind: str
  hbm_gib: float
  peak_tflops: float
  # libtpu's chip configuration of a live host: one device per chip (the
  # two TensorCores of a v4 or v5p as one, as JAX runs them); None: the
  # default, which already is.
  chip_config_name: str | None = None


CHIPS = {chip.kind: chip for chip in (
    Chip('v4', 'TPU v4', 32, 275, 'megacore'),
    Chip('v5e', 'TPU v5 lite', 16, 197),
    Chip('v5p', 'TPU v5', 95, 459, 'megachip_tccontrol'),
    Chip('v6e', 'TPU v6 lite', 32, 918, 'megachip_tccontrol'),
)}
# The chips one host of these slices holds (x, y, z); a smaller topology
# is described as one host of its own size.
HOST_BOUNDS = (2, 2, 1)


@dataclasses.dataclass(frozen=True)
class Gpu:
  """An NVIDIA card as XLA:GPU's compiler needs to know it (NVIDIA's data
  sheets; the SXM parts): its name as JAX's devices give it, memory,
  memory bandwidth, L2 cache, SMs, clock and compute capability."""
  kind: str
  device_kind: str
  memory_bytes: int
  bandwidth: int  # bytes/s
  l2_bytes: int
  cores: int
  clock_ghz: float
  capability: tuple[int, int]
  peak_tflops: float  # dense bfloat16

  @property
  def memory_gib(self) -> float:
    return round(self.memory_bytes / GIB, 1)

  def target_config(self) -> str:
    """XLA's GpuTargetConfigProto for the card, as text."""
    major, minor = self.capability
    return '\n'.join((
        'gpu_device_info {',
        '  threads_per_block_limit: 1024', '  threads_per_warp: 32',
        '  shared_memory_per_block: 49152',
        '  shared_memory_per_core: 233472',
        '  shared_memory_per_block_optin: 232448',
        '  threads_per_core_limit: 2048', f'  core_count: {self.cores}',
        '  fpus_per_core: 128', '  block_dim_limit_x: 2147483647',
        '  block_dim_limit_y: 65535', '  block_dim_limit_z: 65535',
        f'  memory_bandwidth: {self.bandwidth}',
        f'  l2_cache_size: {self.l2_bytes}',
        f'  clock_rate_ghz: {self.clock_ghz}',
        f'  device_memory_size: {self.memory_bytes}',
        # Hopper's 'a' features (wgmma), which NVIDIA's own parts have.
        f'  cuda_compute_capability {{ major: {major} minor: {minor}'
        + (' feature_extension: ACCELERATED_FEATURES' if major == 9 else '')
        + ' }',
        '  registers_per_core_limit: 65536',
        '  registers_per_block_limit: 65536',
        '  device_vendor: "NVIDIA Corporation"',
        f'  name: "{self.device_kind}"',
        '}',
        'platform_name: "CUDA"',
        # The cuDNN XLA may assume (fused attention needs 9 or later); the
        # compiles checked against an H100's measurements used this one.
        'dnn_version_info { major: 9 minor: 10 }',
        f'device_description_str: "{self.device_kind}"'))


# The cards of `gpu_compiler.CARDS`.
GPUS = {gpu.kind: gpu for gpu in (
    Gpu('h100', 'NVIDIA H100 80GB HBM3', 84_942_979_072, 3_352_320_000_000,
        50 * 2 ** 20, 132, 1.98, (9, 0), 989),
    Gpu('h200', 'NVIDIA H200', 150_754_820_096, 4_800_000_000_000,
        50 * 2 ** 20, 132, 1.98, (9, 0), 989),
)}


@dataclasses.dataclass(frozen=True)
class Target:
  """What the programs are compiled for: `devices` (all of them; the trainer
  and the builder take the first ones) and the words every figure carries,
  `compiler` and `device` (e.g. 'XLA:TPU (libtpu 0.0.42.1)', 'TPU v4').
  `chip`: a TPU's kind, one device a chip; `gpu`: a GPU's (both None for
  faked CPU devices)."""
  name: str
  devices: list
  compiler: str
  device: str
  chip: Chip | None = None
  gpu: Gpu | None = None

  @property
  def description(self) -> str:
    return f'{self.compiler}, {self.device}'

  @property
  def memory_gib(self) -> float | None:
    """One device's memory: a TPU chip's HBM, a GPU's; None for CPUs."""
    if self.chip:
      return self.chip.hbm_gib
    return self.gpu.memory_gib if self.gpu else None


def cpu_target() -> Target:
  """JAX's CPU devices (faked: `--xla_force_host_platform_device_count`)."""
  return Target('cpu', jax.devices('cpu'),
                f'XLA:CPU (jaxlib {jax.lib.__version__})',
                'faked CPU devices')


def libtpu_dir() -> str:
  """Where libtpu is installed apart: $REALM_JAX_LIBTPU, else
  <sys.prefix>/libtpu (`make setup`'s)."""
  return os.environ.get(LIBTPU_DIR_ENV) or os.path.join(sys.prefix, 'libtpu')


def find_libtpu() -> tuple[str, str]:
  """(libtpu.so's path, libtpu's version): from `libtpu_dir()`, else this
  environment (`pip install 'realm-jax[tpu]'`); MissingExtra, one line
  saying how to install it, if neither has it."""
  apart = libtpu_dir()
  library = os.path.join(apart, 'libtpu', 'libtpu.so')
  if epath.Path(library).is_file():
    found = list(importlib.metadata.distributions(name='libtpu',
                                                  path=[apart]))
    return library, found[0].version if found else 'unknown version'
  spec = importlib.util.find_spec('libtpu')  # Finds it without importing.
  if spec is not None and spec.submodule_search_locations:
    library = os.path.join(spec.submodule_search_locations[0], 'libtpu.so')
    if epath.Path(library).is_file():
      return library, importlib.metadata.version('libtpu')
  raise extras.MissingExtra(
      f'Compiling for a TPU needs libtpu, which is not in {apart}: `make '
      f'setup` installs it there, or `pip install --no-deps --target {apart} '
      f"'{LIBTPU}'`.")


@contextlib.contextmanager
def _environment(**values):
  """`values` in os.environ inside the block; the environment as it was
  after it, for the processes this one starts later."""
  saved = {name: os.environ.get(name) for name in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


def _topology(name: str) -> tuple[Chip, tuple[int, ...]]:
  """'v4:4x4x4' -> (v4's Chip, (4, 4, 4)); BadConfig for anything else."""
  match = re.fullmatch(r'([a-z0-9]+):(\d+(?:x\d+){1,2})', name)
  if not match or match.group(1) not in CHIPS:
    raise errors.BadConfig(
        f'TPU topology {name!r}: expected <chip>:<x>x<y>[x<z>] with chip one '
        f'of {", ".join(CHIPS)}, e.g. tpu:v4:2x2x1.')
  dims = tuple(int(d) for d in match.group(2).split('x'))
  return CHIPS[match.group(1)], dims + (1,) * (3 - len(dims))


def _accelerator_type(chip: Chip, chips: int) -> str:
  """The name Cloud TPU gives the slice (v4 and v5p count TensorCores)."""
  return {'v4': f'v4-{2 * chips}', 'v5p': f'v5p-{2 * chips}',
          'v5e': f'v5litepod-{chips}', 'v6e': f'v6e-{chips}'}[chip.kind]


def tpu_target(topology: str) -> Target:
  """The devices of the TPU slice `topology` (e.g. 'v4:4x4x4'), as libtpu
  describes it on this machine, with or without a TPU. libtpu is loaded
  from where `find_libtpu` finds it, in this process only; the process's
  own JAX devices stay what they are."""
  chip, dims = _topology(topology)
  library, version = find_libtpu()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  options = {'chips_per_host_bounds': tuple(
      min(d, h) for d, h in zip(dims, HOST_BOUNDS))}
  if chip.chip_config_name:
    options['chip_config_name'] = chip.chip_config_name
  try:
    # JAX loads libtpu from TPU_LIBRARY_PATH, and libtpu reads what a TPU
    # host's environment says (without it, it warns) as it starts: here.
    # No TPU is used, so no lock keeps other processes' compiles out.
    host = {'TPU_ACCELERATOR_TYPE': _accelerator_type(chip, math.prod(dims)),
            'TPU_WORKER_HOSTNAMES': 'localhost'}
    with _environment(TPU_LIBRARY_PATH=library,
                      ALLOW_MULTIPLE_LIBTPU_LOAD='1',
                      **{name: os.environ.get(name, value)
                         for name, value in host.items()}):
      devices = topologies.get_topology_desc(
          topology_name=topology, platform='tpu', **options).devices
  except jax.errors.JaxRuntimeError as error:
    raise errors.BadConfig(f'TPU topology {topology!r}: '
                           f'{errors.one_line(error)}') from error
  if len(devices) != math.prod(dims):  # The figures are per chip.
    raise RuntimeError(f'libtpu described {topology} as {len(devices)} '
                       f'devices, not {math.prod(dims)} chips.')
  return Target(f'tpu:{topology}', list(devices),
                f'XLA:TPU (libtpu {version})', chip.device_kind, chip)


def gpu_target(name: str) -> Target:
  """`count` GPUs of one host, `name` '<card>[x<count>]' (e.g. 'h100',
  'h100x8'), described to XLA:GPU by the card's facts (`GPUS`); no GPU is
  needed. The process's own JAX devices stay what they are."""
  card, count = gpu_compiler.parse(name)
  gpu = GPUS[card]
  gpu_compiler.use()
  from jax._src.lib import cuda_versions  # pylint: disable=g-import-not-at-top
  if cuda_versions is None:
    raise RuntimeError(
        "JAX started before its CUDA plugin was on the path, so its fused "
        'attention finds no cuDNN: call realm_jax.gpu_compiler.use() before '
        'importing jax (`realm-jax aot` does).')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    devices = topologies.get_topology_desc(
        topology_name=name, platform='cuda', topology=f'1 x 1 x {count}',
        target_config=gpu.target_config()).devices
  except (jax.errors.JaxRuntimeError, NotImplementedError) as error:
    # NotImplementedError: JAX registered no CUDA plugin.
    raise errors.BadConfig(f'GPU {name!r}: {errors.one_line(error)}') from error
  return Target(f'gpu:{name}', list(devices),
                f'XLA:GPU (jax-cuda13-plugin {gpu_compiler.version()}, no '
                'GPU: nothing autotuned)', gpu.device_kind, gpu=gpu)


@dataclasses.dataclass
class Program:
  """One compiled program's per-device figures (on a TPU one device is one
  chip), and what compiled them for which device (`Target.description`)."""
  name: str
  devices: int
  shape: str  # What one call processes.
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  # Per device, per call: the matrix products' FLOPs in the traced program
  # (`matmul_flops`: every trip of every loop, remat's recompute included);
  # exact search's, 2 x queries x rows x dimensions.
  flops: float
  # XLA's cost analysis of the compiled program (everything, but a loop's
  # body once), times `loop_trips`; None where XLA gives none (XLA:GPU
  # without a GPU).
  xla_flops: float | None = 0.0
  compiled_by: str = ''
  # Calls of Pallas kernels (the splash attention) in the program: neither
  # count has their FLOPs, so where there are any both are lower bounds.
  kernel_calls: int = 0
  compile_seconds: float = 0.0  # XLA's compile alone, on this machine.
  # A TPU step's time at `MFU` of its chip's peak: flops / (MFU x peak).
  seconds_at_mfu: float | None = None

  @property
  def total_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes + self.temp_bytes
            - self.alias_bytes)

  def as_dict(self) -> dict:
    return {**dataclasses.asdict(self), 'total_bytes': self.total_bytes}


def _subjaxprs(params: dict):
  """The jaxprs an equation's parameters hold (a call's, a loop's body, a
  cond's branches)."""
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item


def matmul_flops(jaxpr) -> tuple[float, int]:
  """(FLOPs of the matrix products `jaxpr` runs, its Pallas kernel calls).

  A product's FLOPs are 2 x its output's elements x the contracted size. A
  scan's body counts `length` times; inside shard_map, one device's shapes
  count once per device; of a cond's branches, the costliest. A
  `jax.checkpoint`'s recompute in the backward pass counts, as it runs. A
  Pallas kernel's FLOPs are unknown here: its calls are counted instead.
  Outside shard_map the shapes are global: divide by the devices for one
  device's share of a data-parallel program.
  """
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  flops, kernels = 0.0, 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      (contracting, _), _ = eqn.params['dimension_numbers']
      lhs = eqn.invars[0].aval.shape
      flops += (2.0 * math.prod(eqn.outvars[0].aval.shape)
                * math.prod(lhs[d] for d in contracting))
      continue
    if name == 'pallas_call':
      kernels += 1
      continue
    inner = [matmul_flops(sub) for sub in _subjaxprs(eqn.params)]
    if not inner:
      continue
    if name == 'cond':
      inner = [max(inner)]
    times = 1
    if name == 'scan':
      times = eqn.params['length']
    elif name == 'shard_map':
      times = math.prod(eqn.params['mesh'].shape[axis]
                        for axis in eqn.params['newly_manual_axes'])
    flops += times * sum(f for f, _ in inner)
    kernels += sum(k for _, k in inner)
  return flops, kernels


def _analyse(name: str, target: Target, devices: int, shape: str, lowered,
             jaxpr=None, flops: float | None = None,
             loop_trips: int = 1) -> Program:
  """Compiles `lowered`; its FLOPs are `jaxpr`'s matrix products' (see
  `matmul_flops`), or `flops`. XLA's cost analysis counts a loop's body
  once: `loop_trips` scales its count (microbatches; the optimizer update
  is then counted that many times too). Of it only the FLOPs are read:
  XLA:TPU's time estimate can be negative."""
  kernel_calls = 0
  if jaxpr is not None:
    flops, kernel_calls = matmul_flops(jaxpr)
    flops /= devices
  start = time.perf_counter()
  compiled = lowered.compile()
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, list):  # Older JAX: one dict per program.
    cost = cost[0]
  xla_flops = None if cost is None else float(cost.get('flops', 0.0))
  return Program(name, devices, shape, memory.argument_size_in_bytes,
                 memory.output_size_in_bytes, memory.temp_size_in_bytes,
                 memory.alias_size_in_bytes, flops,
                 None if xla_flops is None else xla_flops * loop_trips,
                 target.description, kernel_calls, compile_seconds=seconds)


def _unsharded(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@gin.configurable
def compile_and_fit(run: RunKind, batch_size: int, num_steps: int,
                    mesh_devices: int, builder_devices: int = 16,
                    num_blocks: int = 13_353_718, block_length: int = 288,
                    embed_batch_size: int = 1024, search_queries: int = 512,
                    search_k: int = 8, search_dtype: str = 'bfloat16',
                    search_chunk_size: int = 65536,
                    target: Target | None = None) -> list[Program]:
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
    target: the devices compiled for (`cpu_target`, `tpu_target` or
      `gpu_target`);
      default: this process's CPU devices. Each program takes the first
      ones it needs.
  """
  target = target or cpu_target()
  devices = target.devices
  needed = max(mesh_devices, builder_devices)
  if len(devices) < needed:
    if target.chip or target.gpu:
      raise errors.BadConfig(
          f'{needed} devices needed; {target.name} has {len(devices)}.')
    raise ValueError(f'{needed} devices needed, {len(devices)} present: set '
                     'XLA_FLAGS=--xla_force_host_platform_device_count='
                     f'{needed} before JAX starts (`realm-jax aot` does).')
  mesh = partitioning.make_mesh(devices=devices[:mesh_devices])
  trainer = Trainer(run.objective, mesh, num_steps)
  abstract = run.objective.abstract_inputs(batch_size, block_length)
  train_step = _analyse(
      f'train step ({type(run).__name__})', target, mesh_devices,
      f'batch {batch_size} in {trainer.microbatches} microbatch(es)',
      trainer.lower(abstract),
      jaxpr=jax.make_jaxpr(trainer._train_step)(  # pylint: disable=protected-access
          trainer.abstract_state, abstract),
      loop_trips=trainer.microbatches)
  if target.chip:
    train_step.seconds_at_mfu = train_step.flops / (
        MFU * target.chip.peak_tflops * 1e12)

  # The builder embeds blocks cut as the run reads them (an ICT run's towers
  # may hold fewer positions than the corpus's blocks have wordpieces).
  embed_length = run.block_length or block_length
  embedder_retriever = model_retriever()
  embedder = DocumentEmbedder(embedder_retriever, embed_batch_size,
                              devices[:builder_devices])
  traced = embedder.trace(_unsharded(
      trainer.abstract_state.params['retriever']), embed_length)
  embed_step = _analyse(
      'embed step', target, builder_devices,
      f'{embed_batch_size} blocks x {embed_length}', traced.lower(),
      jaxpr=traced.jaxpr)

  search_mesh = index_mesh(devices[:builder_devices])
  rows = -(-num_blocks // builder_devices) * builder_devices
  dim = embedder_retriever.projection_size
  replicated = jax.sharding.NamedSharding(search_mesh,
                                          jax.sharding.PartitionSpec())
  split = jax.sharding.NamedSharding(search_mesh,
                                     jax.sharding.PartitionSpec(AXIS))
  search = sharded_top_k(search_mesh, num_blocks, search_k, search_chunk_size)
  exact_search = _analyse(
      'exact search', target, builder_devices,
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


def _flops(flops: float | None, bound: str = '') -> str:
  if flops is None:
    return 'none given'
  for unit, scale in (('PFLOP', 1e15), ('TFLOP', 1e12), ('GFLOP', 1e9),
                      ('MFLOP', 1e6)):
    if flops >= scale or unit == 'MFLOP':
      return f'{bound}{flops / scale:.3g} {unit}'


def _seconds(seconds: float | None, bound: str = '') -> str:
  if seconds is None:
    return ''
  for unit, scale in (('s', 1.0), ('ms', 1e-3), ('µs', 1e-6)):
    if seconds >= scale or unit == 'µs':
      return f'{bound}{seconds / scale:.3g} {unit}'


def caption(target: Target, device_memory_gib: float) -> str:
  """What the table's figures are: whose, for which device, against what."""
  if target.chip is None:
    return (f'Per device, compiled by {target.compiler} for '
            f'{target.device}, against {device_memory_gib:g} GiB:')
  chip = target.chip
  return (f'Per chip, compiled by {target.compiler} for {target.device} '
          f'(topology {target.name[len("tpu:"):]}, {len(target.devices)} '
          f'chips; {chip.hbm_gib:g} GiB HBM, {chip.peak_tflops:g} TFLOP/s '
          f'bf16 peak), against {device_memory_gib:g} GiB:')


def table(programs: list[Program], device_memory_gib: float,
          target: Target | None = None) -> str:
  """A markdown table of the figures against one device's memory; for a
  TPU, per chip, with the train step's time at `MFU`."""
  gib = lambda b: (f'{b / GIB:.2f} GiB' if b >= GIB / 100
                   else f'{b / 2 ** 20:.2f} MiB')
  fits = lambda p: 'yes' if p.total_bytes < device_memory_gib * GIB else 'NO'
  tpu = target is not None and target.chip is not None
  where = 'chip' if tpu else 'device'
  lines = [f'| program | {where}s | one call | arguments | outputs '
           f'| temporaries | total per {where} | fits in '
           f'{device_memory_gib:g} GiB | matmul FLOPs per {where} '
           "| XLA's count |" + (f' step at {MFU:.0%} MFU |' if tpu else ''),
           '|---' * (11 if tpu else 10) + '|']
  for p in programs:
    bound = '≥ ' if p.kernel_calls else ''  # Kernels' FLOPs left out.
    lines.append(
        f'| {p.name} | {p.devices} | {p.shape} | {gib(p.argument_bytes)} | '
        f'{gib(p.output_bytes)} | {gib(p.temp_bytes)} | '
        f'{gib(p.total_bytes)} | {fits(p)} | {_flops(p.flops, bound)} | '
        f'{_flops(p.xla_flops, bound)} |'
        + (f' {_seconds(p.seconds_at_mfu, bound)} |' if tpu else ''))
  lines.append(
      '\nmatmul FLOPs: the traced program\'s matrix products, every loop trip '
      "(remat's recompute included); XLA's count: all operations, a loop's "
      'body once (the microbatch loop scaled).' + (
          ' ≥: the program calls Pallas kernels (splash attention), whose '
          'FLOPs neither count has.' if any(p.kernel_calls for p in programs)
          else ''))
  return '\n'.join(lines)


def report(programs: list[Program], target: Target, mesh_devices: int,
           builder_devices: int, device_memory_gib: float) -> dict:
  """The figures as JSON: each program's, and the target's."""
  chip = target.chip
  return {'target': target.name, 'compiler': target.compiler,
          'device': target.device, 'mesh': mesh_devices,
          'builder_mesh': builder_devices,
          'device_memory_gib': device_memory_gib,
          'gpu': None if target.gpu is None else dataclasses.asdict(
              target.gpu),
          'chip': None if chip is None else {
              'kind': chip.kind, 'hbm_gib': chip.hbm_gib,
              'peak_bf16_tflops': chip.peak_tflops},
          'mfu': None if chip is None else MFU,
          'programs': [p.as_dict() for p in programs]}
