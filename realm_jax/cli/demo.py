"""`realm-jax demo`: REALM in miniature: a preset run end to end."""

import os

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'demo'


def add_parser(command, flags) -> None:
  del flags
  demo = command(
      'demo', help='REALM in miniature on the embedded default: corpus, '
      'ICT, the reader\'s warm start, pre-training with the index builder '
      'beside it against a trained no-retrieval baseline, every comparison '
      'with a paired bootstrap interval (recall needs $REALM_DATA_DIR). '
      'Finished stages are skipped on a re-run.')
  demo.add_argument('--work_dir', default=None,
                    help='Every run, index and result (default: '
                    'runs/<preset>).')
  demo.add_argument('--record', action='store_true',
                    help='Also write the report into docs/results/<preset>.* '
                    '(a source tree\'s record, which the next run of the '
                    'preset plans from); without it nothing outside '
                    '--work_dir changes.')
  demo.add_argument('--repeats', type=common.positive(int), default=1,
                    help='Run the preset this many times, seeds 0 to N-1, '
                    'each under <work_dir>/seed_<s>, and report each '
                    'figure\'s mean and range and each comparison\'s '
                    'interval in every run.')
  demo.add_argument('--lockstep', action='store_true',
                    help='The trainer retrieves from the index of a fixed '
                    'earlier step, waited for if late, instead of the newest '
                    'one the builder has published: a run then depends on '
                    'its seed alone, not on the builder\'s speed (world '
                    'presets).')
  demo.add_argument('--preset', default='demo',
                    help='A preset by name, or a preset file (a .py file that '
                    'defines PRESET, as realm_jax/experiments/presets/ '
                    'holds them). demo: the two core checks (meant for at most '
                    '20 minutes on 2 cores); reproduce: the miniature Table 2 '
                    '(at most 90; each record\'s time is in docs/RESULTS.md); '
                    'end_to_end: the demo, then NQ fine-tuning with the '
                    'document tower frozen and trained (--work_dir=runs/demo '
                    'reuses the demo\'s stages); gpu: the demo at '
                    'accelerator size on one GPU, from a bundle (make '
                    'bundle-gpu; docs/accelerators.md); signals: the demo\'s '
                    'REALM beside the same run trained by perplexity '
                    'distillation\'s retriever signal '
                    '(--work_dir=runs/demo reuses the demo\'s stages); '
                    'world: REALM\'s '
                    'four claims in a controlled knowledge world, where each '
                    'fact is in '
                    'one document; world_top3 and world_warmup30: the same '
                    'with the null document and the top 3 (8 in all by '
                    'default), and with REALM\'s warmup over 30 steps (100 '
                    'by default); '
                    'world_pdist: the world with the retriever trained by '
                    'perplexity distillation; '
                    'world_small: its REALM and baseline alone, '
                    'in a smaller world (the learning test\'s).')


def run(args) -> None:
  from realm_jax.experiments import demo, runner, world_demo  # pylint: disable=g-import-not-at-top
  from realm_jax.experiments import preset as preset_lib  # pylint: disable=g-import-not-at-top
  family = preset_lib.load(args.preset).family
  families = [demo.FAMILY.name, world_demo.FAMILY.name]
  if family not in families:
    raise errors.BadConfig(
        f'--preset={args.preset}: family={family!r} is no known family; '
        f'give one of {families}.')
  work_dir = args.work_dir or os.path.join(
      'runs', os.path.basename(args.preset).removesuffix('.py'))
  common.check_output_dir(work_dir, '--work_dir')
  docs_dir = os.fspath(runner.DOCS_RESULTS) if args.record else None
  if family == 'world':
    if args.repeats > 1:
      world_demo.run_repeats(work_dir, args.preset, docs_dir, args.repeats,
                             args.lockstep)
    else:
      world_demo.run(work_dir, args.preset, docs_dir, lockstep=args.lockstep)
    return
  if args.lockstep:
    raise errors.BadConfig(f'--lockstep is for the world presets, not '
                           f'--preset={args.preset}.')
  if args.repeats > 1:
    demo.run_repeats(work_dir, args.preset, docs_dir, args.repeats)
  else:
    demo.run(work_dir, args.preset, docs_dir)
