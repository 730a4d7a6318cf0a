"""`realm-jax aot`: compiled for a target mesh before paying for it."""

import argparse
import json
import os

from realm_jax import errors, gpu_compiler
from realm_jax.cli import common

COMMAND = 'aot'


def add_parser(command, flags) -> None:
  del flags
  aot = command(
      'aot', help='Compile the train step, the index builder\'s embedding '
      'step and exact search for a target mesh (abstract inputs: nothing '
      'allocated) and print per-device memory and FLOPs: faked CPU devices '
      '(--target=cpu), or a TPU slice compiled by XLA:TPU on this machine '
      '(--target=tpu:v4:4x4x4; needs libtpu, which make setup installs in '
      '.venv/libtpu), or NVIDIA GPUs compiled by XLA:GPU without one '
      '(--target=gpu:h100; needs JAX\'s CUDA plugin: make gpu-compiler).',
      epilog='e.g. realm-jax aot --gin_file=gin/setups/paper_scale.gin '
      '--mesh=64, or --target=tpu:v4:4x4x4 --builder_mesh=16')
  aot.add_argument('--target', type=_aot_target, default='cpu',
                   help="'cpu' (faked CPU devices), 'tpu:<topology>', e.g. "
                   "tpu:v4:2x2x1 (v4, v5e, v5p or v6e; one device a chip), "
                   "or 'gpu:<card>[x<count>]', e.g. gpu:h100 or gpu:h200x8.")
  aot.add_argument('--mesh', type=common.positive(int), default=None,
                   help="The trainer's device count (needed for --target=cpu;"
                   " a TPU or GPU target's default: all of its devices).")
  aot.add_argument('--builder_mesh', type=common.positive(int),
                   default=None,
                   help="The index builder's device count (default: 16, or "
                   "all of a TPU or GPU target's devices, if fewer).")
  aot.add_argument('--run', choices=('pretrain', 'ict', 'finetune'),
                   default='pretrain',
                   help='gin/runs/<run>.gin, read before the --gin_file(s).')
  aot.add_argument('--model_dir', default=None,
                   help="Compile a training run's own config (its "
                   'config.gin, the --gin_file(s) layered over it) instead '
                   'of --run.')
  aot.add_argument('--device_memory_gib', type=common.positive(float),
                   default=None,
                   help='One device\'s memory (default: a TPU chip\'s HBM or '
                   'a GPU\'s memory, and 32 GiB, a TPU v4\'s, for '
                   '--target=cpu).')
  aot.add_argument('--output', default=None,
                   help='Also write the figures here as JSON.')
  aot.add_argument('--gin_file', action='append', default=[])
  aot.add_argument('--gin_bindings', action='append', default=[])


def _aot_target(value: str) -> str:
  """--target: 'cpu', 'tpu:<topology>' or 'gpu:<card>[x<count>]'."""
  if value != 'cpu' and not (value[:4] in ('tpu:', 'gpu:') and len(value) > 4):
    raise argparse.ArgumentTypeError(
        f"{value!r}: 'cpu', 'tpu:<topology>' (e.g. tpu:v4:2x2x1) or "
        "'gpu:<card>[x<count>]' (e.g. gpu:h100)")
  return value


def before_jax(args) -> None:
  """A GPU target's compiler, JAX's CUDA plugin, on the path: JAX finds
  it, and the cuDNN its fused attention checks for, only as it starts."""
  if args.target.startswith('gpu:'):
    gpu_compiler.parse(args.target.split(':', 1)[1])  # A known card first.
    gpu_compiler.use()


def run(args) -> None:
  tpu = args.target.startswith('tpu:')
  gpu = args.target.startswith('gpu:')
  if not (tpu or gpu) and args.mesh is None:
    raise errors.BadConfig('--target=cpu needs --mesh, the trainer\'s '
                           'device count.')
  if args.output:
    common.check_output(args.output, '--output')
  builder_mesh = args.builder_mesh or 16
  # Before JAX starts: its own devices are the host's CPUs, faked to the
  # target mesh's size for XLA:CPU; a TPU's or a GPU's devices are those
  # its compiler describes.
  os.environ['JAX_PLATFORMS'] = 'cpu'
  if not (tpu or gpu):
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_'
        f'device_count={max(args.mesh, builder_mesh)}')
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax import aot  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  if tpu or gpu:
    name = args.target.split(':', 1)[1]
    target = aot.tpu_target(name) if tpu else aot.gpu_target(name)
    mesh = args.mesh or len(target.devices)
    if args.builder_mesh is None:
      builder_mesh = min(builder_mesh, len(target.devices))
    memory_gib = args.device_memory_gib or target.memory_gib
  else:
    target = aot.cpu_target()
    mesh, memory_gib = args.mesh, args.device_memory_gib or 32.0
  # The accelerators' attention, not the faked CPU devices' loop.
  args.gin_bindings = ['BertConfig.attention_chunk = 0', *args.gin_bindings]
  if args.model_dir:
    configured = run_loader.load_run(args.model_dir, args.gin_file,
                                     args.gin_bindings)
  else:
    args.gin_file = [os.path.join(run_loader.GIN_DIR, 'runs',
                                  f'{args.run}.gin'), *args.gin_file]
    common.parse_gin(args)
    configured = run_loader.configured_run()
  programs = aot.compile_and_fit(configured.run, configured.batch_size,
                                 configured.num_steps, mesh, builder_mesh,
                                 target=target)
  print(aot.caption(target, memory_gib))
  print(aot.table(programs, memory_gib, target))
  if args.output:
    epath.Path(args.output).write_text(json.dumps(
        aot.report(programs, target, mesh, builder_mesh, memory_gib),
        indent=2))
  over = [p.name for p in programs if p.total_bytes >= memory_gib * aot.GIB]
  if over:
    raise errors.BadConfig(
        f'Does not fit in {memory_gib:g} GiB per '
        f'{"chip" if target.chip else "device"}: {", ".join(over)} '
        f'({target.description}).')
