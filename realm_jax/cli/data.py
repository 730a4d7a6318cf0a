"""`realm-jax data`: build, annotate and export corpora and examples."""

import dataclasses
import functools
import os

from realm_jax.cli import common

COMMAND = 'data'


def add_parser(command, flags) -> None:
  data = command('data', help='Build and annotate corpora.')
  steps = data.add_subparsers(dest='step', required=True)
  step = functools.partial(steps.add_parser, parents=[flags])
  build = step(
      'build-corpus', help='Chunk articles at sentences into blocks of <= '
      '--max_block_length wordpieces, the title in each.')
  build.add_argument('--output_dir', default=None,
                     help='Default: $REALM_CORPUS_DIR/wiki_leads (or '
                     'runs/corpora/wiki_leads).')
  build.add_argument('--jsonl', action='append', default=None,
                     help='JSONL {"title", "text"} file (repeatable); default: '
                     'the embedded Wikipedia leads.')
  build.add_argument('--vocab', default=None,
                     help='WordPiece vocab.txt (default: the embedded one).')
  build.add_argument('--max_block_length', type=common.positive(int),
                     default=288,
                     help="The paper's 288, or the length the runs read "
                     '(Pretrain.block_length), so that none of the text goes '
                     'unread; the title takes at most a quarter.')
  build.add_argument('--blocks_per_shard', type=common.positive(int),
                     default=100_000)
  annotate = step(
      'annotate', help='Find salient spans (entities, dates) in a corpus.')
  annotate.add_argument('--corpus_dir', default=None,
                        help='Default: the wiki_leads corpus directory.')
  annotate.add_argument('--vocab', default=None)
  annotate.add_argument('--num_processes', type=common.positive(int),
                        default=os.cpu_count() or 1)
  export = step(
      'export', help="A run's examples (and its corpus's block store) "
      'written as pre-tokenized arrays, which the TF-free core reads '
      "(Examples.source = 'arrays'): the same examples as its seqio tasks, "
      'at the shapes its gin files set; for pre-training, the corpus\'s '
      'sentences and salient spans, its queries drawn from them as each '
      'batch is made.',
      epilog='e.g. realm-jax data export --gin_file=gin/runs/pretrain.gin '
      '--gin_file=gin/setups/demo.gin')
  export.add_argument('--gin_file', action='append', required=True,
                      help='The run\'s gin files (repeatable), as `train` '
                      'takes them.')
  export.add_argument('--gin_bindings', action='append', default=[])
  export.add_argument('--output_dir', default=None,
                      help='The arrays\' root (default $REALM_ARRAYS_DIR, '
                      'else runs/arrays).')

  world = step(
      'world', help='Write a controlled knowledge world (realm_jax/data/'
      'world.py) as the corpus $REALM_CORPUS_DIR/world and its query '
      'arrays under $REALM_ARRAYS_DIR, at the shapes of '
      'gin/setups/world.gin: what `demo --preset=world` trains on.')
  from realm_jax.data import world as world_lib  # pylint: disable=g-import-not-at-top
  for field in dataclasses.fields(world_lib.WorldSpec):
    kind = field.type if field.type in (int, float) else str
    world.add_argument(f'--{field.name}', type=kind, default=None,
                       help=f'default {field.default!r}' + (
                           ' (comma-separated)' if kind is str else ''))


def _tokenizer(vocab):
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  from realm_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  return WordPieceTokenizer(vocab or default_files.minilm_vocab())


def run(args) -> None:
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  if getattr(args, 'output_dir', None):
    common.check_output_dir(args.output_dir, '--output_dir')
  if args.step == 'build-corpus':
    corpus.build_corpus(
        args.output_dir or corpus.corpus_dir('wiki_leads'),
        _tokenizer(args.vocab),
        wiki_leads_json=None if args.jsonl else default_files.wiki_leads_json(),
        jsonl_paths=args.jsonl, max_block_length=args.max_block_length,
        blocks_per_shard=args.blocks_per_shard)
  elif args.step == 'export':
    from realm_jax.data import block_store  # pylint: disable=g-import-not-at-top
    from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
    common.parse_gin(args)
    configured = run_loader.configured_run()
    exporter = configured.exporter()
    store = block_store.open_store(corpus.corpus_dir(
        configured.run.corpus_name))
    print(f'{configured.run.corpus_name}: {store.num_blocks:,} blocks in its '
          'block store')
    for split in configured.run.example_splits():
      written = exporter.export(
          split.task, split.split, split.shapes, configured.seed,
          args.output_dir, split.corpus_name, split.strings, split.metadata)
      print(f'{split.task} {split.split}: {written["count"]:,} examples')
  elif args.step == 'world':
    from realm_jax.experiments import world_demo  # pylint: disable=g-import-not-at-top
    from realm_jax.data import world  # pylint: disable=g-import-not-at-top
    given = {f.name: getattr(args, f.name)
             for f in dataclasses.fields(world.WorldSpec)
             if getattr(args, f.name) is not None}
    if 'attributes' in given:
      given['attributes'] = tuple(a for a in given['attributes'].split(',')
                                  if a)
    spec = world.WorldSpec(**given)
    spec.check()
    # Its runs' BERTs embed the world's own vocabulary (world.VOCAB_SIZE).
    vocab = os.environ.get(default_files.VOCAB_ENV) or world.write_vocabulary(
        os.path.join(os.path.dirname(corpus.corpus_dir(world_demo.CORPUS)),
                     'world_vocab.txt'))
    os.environ[default_files.VOCAB_ENV] = vocab
    made = world_demo.make_world(spec)
    print(f'{made["blocks"]:,} documents in {made["corpus_dir"]}, '
          f'tokenized by {vocab}: export {default_files.VOCAB_ENV}={vocab} '
          'for the commands that read them.')
  elif args.step == 'annotate':
    from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
    salient_spans.annotate_corpus(
        args.corpus_dir or corpus.corpus_dir('wiki_leads'),
        _tokenizer(args.vocab), num_processes=args.num_processes)
