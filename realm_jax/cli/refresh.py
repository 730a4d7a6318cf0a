"""`realm-jax refresh`: the index builder."""

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'refresh'


def add_parser(command, flags) -> None:
  del flags
  refresh = command(
      'refresh', help='The index builder: re-embed and publish every new '
      'trainer checkpoint until training is done.')
  refresh.add_argument('--model_dir', required=True)
  refresh.add_argument('--corpus_dir', default=None)
  refresh.add_argument('--searcher', choices=('exact', 'scann'),
                       default='exact')
  refresh.add_argument('--poll_seconds', type=common.positive(float),
                       default=2.0)
  refresh.add_argument('--batch_size', type=common.positive(int), default=64)
  common.add_gin(refresh, 'gin/models/minilm_l6.gin')


def run(args) -> None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax.index import refresh  # pylint: disable=g-import-not-at-top
  if epath.Path(args.model_dir).is_file():
    raise errors.BadConfig(f'--model_dir {args.model_dir} is a file.',
                           'Give the run directory that the trainer writes.')
  common.parse_gin(args)
  refresh.run_refresh(args.model_dir, common.corpus_dir(args), args.searcher,
                      args.poll_seconds, args.batch_size)
