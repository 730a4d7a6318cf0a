"""`realm-jax refresh`: the index builder."""

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'refresh'
# The builder's settings that are flags as well as gin parameters.
_SETTINGS = ('searcher', 'poll_seconds', 'batch_size')


def add_parser(command, flags) -> None:
  del flags
  refresh = command(
      'refresh', help='The index builder: re-embed and publish every new '
      'trainer checkpoint until training is done.')
  refresh.add_argument('--model_dir', required=True)
  refresh.add_argument('--corpus_dir', default=None)
  # Each also a gin setting of run_refresh (default there): a flag or a
  # binding, never both.
  refresh.add_argument('--searcher', choices=('exact', 'scann'),
                       default=None, help='default: exact')
  refresh.add_argument('--poll_seconds', type=common.positive(float),
                       default=None, help='default: 2')
  refresh.add_argument('--batch_size', type=common.positive(int),
                       default=None, help='default: 64')
  common.add_gin(refresh, 'gin/models/minilm_l6.gin')


def run(args) -> None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax.index import refresh  # pylint: disable=g-import-not-at-top
  if epath.Path(args.model_dir).is_file():
    raise errors.BadConfig(f'--model_dir {args.model_dir} is a file.',
                           'Give the run directory that the trainer writes.')
  common.parse_gin(args)
  flags = common.flags_not_bound(
      'run_refresh', {name: getattr(args, name) for name in _SETTINGS},
      "the builder's")
  refresh.run_refresh(args.model_dir, common.corpus_dir(args), **flags)
