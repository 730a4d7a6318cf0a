"""`realm-jax train`: one run kind trained as gin configures it."""

from realm_jax.cli import common

COMMAND = 'train'


def add_parser(command, flags) -> None:
  del flags
  train = command(
      'train', help='Train one run kind (ICT, REALM pre-training, Open-QA '
      'fine-tuning) as configured by gin; resumes from model_dir.',
      epilog='Layer gin files like t5x: a run, then a setup, e.g. '
      '--gin_file=gin/runs/pretrain.gin --gin_file=gin/setups/cpu_demo.gin. '
      'Single bindings also as --gin.train.num_steps=10.')
  train.add_argument('--model_dir', required=True,
                     help='Checkpoints, metrics and the index live here.')
  train.add_argument('--gin_file', action='append', required=True,
                     help='gin config (repeatable; later files override).')
  train.add_argument('--gin_bindings', action='append', default=[])


def run(args) -> None:
  from realm_jax.index import refresh  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  # Imported for gin alone: the index builder's cadence (run_refresh's) is
  # bound for the trainer, which records it in run.json for the builder.
  del refresh
  common.parse_gin(args)
  run_loader.train(args.model_dir)
