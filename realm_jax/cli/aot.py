"""`realm-jax aot`: compiled for a target mesh before paying for it."""

import argparse
import json
import os

from realm_jax import errors
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
      '.venv/libtpu).',
      epilog='e.g. realm-jax aot --gin_file=gin/setups/paper_scale.gin '
      '--mesh=64, or --target=tpu:v4:4x4x4 --builder_mesh=16')
  aot.add_argument('--target', type=_aot_target, default='cpu',
                   help="'cpu' (faked CPU devices) or 'tpu:<topology>', e.g. "
                   "tpu:v4:2x2x1 (v4, v5e, v5p or v6e; one device a chip).")
  aot.add_argument('--mesh', type=int, default=None,
                   help="The trainer's device count (needed for --target=cpu;"
                   " a TPU target's default: every chip of the topology).")
  aot.add_argument('--builder_mesh', type=int, default=None,
                   help="The index builder's device count (default: 16, or "
                   "every chip of a TPU topology with fewer).")
  aot.add_argument('--run', choices=('pretrain', 'ict', 'finetune'),
                   default='pretrain',
                   help='gin/runs/<run>.gin, read before the --gin_file(s).')
  aot.add_argument('--model_dir', default=None,
                   help="Compile a training run's own config (its "
                   'config.gin, the --gin_file(s) layered over it) instead '
                   'of --run.')
  aot.add_argument('--device_memory_gib', type=float, default=None,
                   help='One device\'s memory (default: a TPU chip\'s HBM, '
                   'and 32 GiB, a TPU v4\'s, for --target=cpu).')
  aot.add_argument('--output', default=None,
                   help='Also write the figures here as JSON.')
  aot.add_argument('--gin_file', action='append', default=[])
  aot.add_argument('--gin_bindings', action='append', default=[])


def _aot_target(value: str) -> str:
  """--target: 'cpu' or 'tpu:<topology>'."""
  if value != 'cpu' and not (value.startswith('tpu:') and len(value) > 4):
    raise argparse.ArgumentTypeError(
        f"{value!r}: 'cpu' or 'tpu:<topology>' (e.g. tpu:v4:2x2x1)")
  return value


def run(args) -> None:
  tpu = args.target.startswith('tpu:')
  if not tpu and args.mesh is None:
    raise errors.BadConfig('--target=cpu needs --mesh, the trainer\'s '
                           'device count.')
  builder_mesh = args.builder_mesh or 16
  # Before JAX starts: its own devices are the host's CPUs, faked to the
  # target mesh's size for XLA:CPU; a TPU target's devices are libtpu's.
  os.environ['JAX_PLATFORMS'] = 'cpu'
  if not tpu:
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_'
        f'device_count={max(args.mesh, builder_mesh)}')
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax import aot  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  if tpu:
    target = aot.tpu_target(args.target[len('tpu:'):])
    mesh = args.mesh or len(target.devices)
    if args.builder_mesh is None:
      builder_mesh = min(builder_mesh, len(target.devices))
    memory_gib = args.device_memory_gib or target.chip.hbm_gib
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
