"""The `realm-jax` command line."""

import argparse
import sys

_DEMO_WORK_DIR = 'runs/demo'


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='realm-jax',
      description='REALM retrieval-augmented pre-training in JAX.')
  commands = parser.add_subparsers(dest='command', required=True)

  demo = commands.add_parser(
      'demo', help='Embed the embedded Wikipedia leads with MiniLM and answer '
      'questions by retrieval.')
  demo.add_argument('--work_dir', default=_DEMO_WORK_DIR,
                    help='Where the document embeddings are cached.')
  demo.add_argument('--question', action='append', dest='questions',
                    help='A question to retrieve for (repeatable); default: a '
                    'few built-in ones.')
  demo.add_argument('--max_docs', type=int, default=None,
                    help='Use only the first N leads (quick runs).')
  demo.add_argument('--max_length', type=int, default=128,
                    help='Wordpieces per document, special tokens included.')
  demo.add_argument('--batch_size', type=int, default=64)
  demo.add_argument('--top_k', type=int, default=5)
  demo.add_argument('--weights_dir', default=None,
                    help='HF-format BERT directory (default: embedded MiniLM).')
  demo.add_argument('--corpus_json', default=None,
                    help='summaries_<lang>.json (default: embedded leads).')
  return parser


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.command == 'demo':
    from realm_jax import demo  # pylint: disable=g-import-not-at-top
    kwargs = {k: v for k, v in vars(args).items()
              if k != 'command' and v is not None}
    demo.run(**kwargs)
  return 0


if __name__ == '__main__':
  sys.exit(main())
