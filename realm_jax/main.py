"""The `realm-jax` command line."""

import argparse
import os
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

  data = commands.add_parser('data', help='Build and annotate corpora.')
  steps = data.add_subparsers(dest='step', required=True)
  build = steps.add_parser(
      'build-corpus', help='Chunk articles into blocks of <= 288 wordpieces.')
  build.add_argument('--output_dir', default=None,
                     help='Default: $REALM_CORPUS_DIR/wiki_leads (or '
                     'runs/corpora/wiki_leads).')
  build.add_argument('--jsonl', action='append', default=None,
                     help='JSONL {"title", "text"} file (repeatable); default: '
                     'the embedded Wikipedia leads.')
  build.add_argument('--vocab', default=None,
                     help='WordPiece vocab.txt (default: the embedded one).')
  build.add_argument('--max_block_length', type=int, default=288)
  build.add_argument('--blocks_per_shard', type=int, default=100_000)
  annotate = steps.add_parser(
      'annotate', help='Find salient spans (entities, dates) in a corpus.')
  annotate.add_argument('--corpus_dir', default=None,
                        help='Default: the wiki_leads corpus directory.')
  annotate.add_argument('--vocab', default=None)
  annotate.add_argument('--num_processes', type=int,
                        default=os.cpu_count() or 1)
  return parser


def _tokenizer(vocab):
  from realm_jax import embedded  # pylint: disable=g-import-not-at-top
  from realm_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  return WordPieceTokenizer(vocab or embedded.minilm_vocab())


def _data(args) -> None:
  from realm_jax import embedded  # pylint: disable=g-import-not-at-top
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  if args.step == 'build-corpus':
    corpus.build_corpus(
        args.output_dir or corpus.corpus_dir('wiki_leads'),
        _tokenizer(args.vocab),
        wiki_leads_json=None if args.jsonl else embedded.wiki_leads_json(),
        jsonl_paths=args.jsonl, max_block_length=args.max_block_length,
        blocks_per_shard=args.blocks_per_shard)
  elif args.step == 'annotate':
    from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
    salient_spans.annotate_corpus(
        args.corpus_dir or corpus.corpus_dir('wiki_leads'),
        _tokenizer(args.vocab), num_processes=args.num_processes)


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.command == 'demo':
    from realm_jax import demo  # pylint: disable=g-import-not-at-top
    kwargs = {k: v for k, v in vars(args).items()
              if k != 'command' and v is not None}
    demo.run(**kwargs)
  elif args.command == 'data':
    _data(args)
  return 0


if __name__ == '__main__':
  sys.exit(main())
