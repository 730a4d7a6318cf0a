"""`realm-jax corpus`: a run's corpus changed in place, its index brought
up to date."""

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'corpus'


def add_parser(command, flags) -> None:
  del flags
  living = command(
      'corpus', help="Change a run's corpus in place and bring its index up "
      'to date, embedding the added blocks alone with the towers that '
      'embedded the rest: add articles, remove them, or sync an index after '
      "another run's change.",
      epilog='e.g. realm-jax corpus add --jsonl=new.jsonl '
      '--model_dir=runs/demo/finetune')
  living.add_argument('action', choices=('add', 'remove', 'sync'))
  living.add_argument('--model_dir', required=True,
                      help='The run whose corpus changes and whose newest '
                      'index is brought up to date.')
  living.add_argument('--jsonl', action='append', default=[],
                      help='add: JSONL {"title", "text"} file (repeatable).')
  living.add_argument('--titles', default=None,
                      help='remove: a file of article titles, one a line.')
  living.add_argument('--batch_size', type=common.positive(int), default=64)


def run(args) -> None:
  from realm_jax.data import corpus, corpus_changes  # pylint: disable=g-import-not-at-top
  from realm_jax.index import corpus_sync  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader, step_inputs  # pylint: disable=g-import-not-at-top
  unread = {'add': ('titles',), 'remove': ('jsonl',),
            'sync': ('jsonl', 'titles')}[args.action]
  for name in unread:
    if getattr(args, name):
      raise errors.BadConfig(f'corpus {args.action} reads no --{name}.')
  loaded = run_loader.load_run(args.model_dir)
  corpus_dir = corpus.corpus_dir(loaded.run.corpus_name)
  if args.action == 'add':
    if not args.jsonl:
      raise errors.BadConfig('Nothing to add.', 'Give --jsonl=FILE.')
    # The index must fit the corpus before it changes.
    corpus_sync.sync_index(loaded.model_dir, corpus_dir, loaded.run.retriever(),
                           args.batch_size)
    _, added = corpus_changes.add_articles(
        corpus_dir, step_inputs.task_tokenizer(), args.jsonl)
    print(f'{corpus_dir}: blocks {added.start:,}-{added.stop - 1:,} added')
  elif args.action == 'remove':
    if not args.titles:
      raise errors.BadConfig('Nothing to remove.', 'Give --titles=FILE.')
    corpus_sync.sync_index(loaded.model_dir, corpus_dir, loaded.run.retriever(),
                           args.batch_size)
    metadata, removed = corpus_changes.remove_titles(corpus_dir, args.titles)
    print(f'{corpus_dir}: {len(removed):,} block(s) removed' + (
        f'; no block titled {metadata["lineage"][-1]["titles_not_found"]}'
        if metadata['lineage'][-1]['titles_not_found'] else ''))
  synced = corpus_sync.sync_index(loaded.model_dir, corpus_dir,
                                  loaded.run.retriever(), args.batch_size)
  if synced is None:
    print(f'{loaded.model_dir}: its index is up to date.')
  else:
    embedded = synced['synced_from']
    print(f'{loaded.model_dir}: index step {synced["step"]} published '
          f'({embedded["blocks_embedded"]:,} block(s) embedded in '
          f'{embedded["seconds"]:.1f} s)')
