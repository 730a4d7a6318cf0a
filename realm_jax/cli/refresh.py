"""`realm-jax refresh`: the index builder."""

import functools

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'refresh'
# The builder's settings that are flags as well as gin parameters.
_SETTINGS = ('searcher', 'poll_seconds', 'batch_size')


def add_parser(command, flags) -> None:
  del flags
  refresh = command(
      'refresh', help='The index builder: re-embed and publish every new '
      'trainer checkpoint until training is done.',
      description='The model, corpus, block length and cadence are the '
      "run's (its config.gin and run.json, waited for): give --model_dir and "
      'the machine settings alone.')
  refresh.add_argument('--model_dir', required=True)
  refresh.add_argument('--corpus_dir', default=None,
                       help='For a run trained before runs recorded '
                       'themselves (run.json). With it or --gin_file the '
                       'builder takes the corpus, model, block length and '
                       'cadence from its flags and gin, as before, and '
                       "refuses any that disagrees with the run's record.")
  # Each also a gin setting of run_refresh (default there): a flag or a
  # binding, never both.
  refresh.add_argument('--searcher', choices=('exact', 'scann'),
                       default=None, help='default: exact')
  refresh.add_argument('--poll_seconds', type=common.positive(float),
                       default=None, help='default: 2')
  refresh.add_argument('--batch_size', type=common.positive(int),
                       default=None, help='default: 64')
  common.add_gin(refresh, "the run's config.gin, bindings layered over it")


def run(args) -> None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax.index import refresh  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  if epath.Path(args.model_dir).is_file():
    raise errors.BadConfig(f'--model_dir {args.model_dir} is a file.',
                           'Give the run directory that the trainer writes.')
  # The way before runs recorded their settings: the flags and gin alone.
  explicit = args.corpus_dir is not None or args.gin_file is not None
  if explicit:
    common.parse_gin(args)
  else:  # Checked now; layered over the run's config.gin once it is there.
    run_loader.parse_gin((), args.gin_bindings, finalize=False)
  flags = common.flags_not_bound(
      'run_refresh', {name: getattr(args, name) for name in _SETTINGS},
      "the builder's")
  if explicit:
    refresh.run_refresh(args.model_dir, common.corpus_dir(args), **flags)
  else:
    refresh.run_refresh(args.model_dir, retriever=functools.partial(
        run_loader.run_retriever, args.model_dir, args.gin_bindings), **flags)
