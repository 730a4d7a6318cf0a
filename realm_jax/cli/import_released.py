"""`realm-jax import`: Google's released REALM, or a realm-jax export, as a
run directory."""

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'import'


def add_parser(command, flags) -> None:
  del flags
  released = command(
      'import', help="Google's released REALM (TF-Hub modules, ORQA "
      "checkpoints or Hugging Face's port) as a run directory, with a "
      'published index of the released block embeddings and a corpus of '
      'the released blocks (docs/released.md); or, with --export, a '
      'realm-jax export read back.',
      epilog='e.g. realm-jax import --model_dir=runs/orqa_nq '
      '--source=orqa_nq_model_from_realm/export/best_default/checkpoint/'
      'model.ckpt-300000 --block_emb=cc_news_pretrained/embedder/encoded/'
      'encoded.ckpt --blocks=enwiki-20181220/blocks.tfr '
      '--titles=enwiki-20181220/titles.tfr')
  released.add_argument('--model_dir', required=True,
                        help='The run directory to write (must not exist).')
  released.add_argument('--export', default=None,
                        help='A directory `realm-jax export` wrote: its run '
                        'read back from the exported files (the corpus it '
                        'names must be under $REALM_CORPUS_DIR).')
  released.add_argument('--source', action='append', default=[],
                        help='Released weights (repeatable): a TF checkpoint '
                        'prefix, a TF-Hub module or Hugging Face directory, '
                        'a .bin or .safetensors file; local or gs://.')
  released.add_argument('--blocks', default=None,
                        help='blocks.tfr or block_records.npy.')
  released.add_argument('--titles', default=None, help='titles.tfr.')
  released.add_argument('--block_emb', default=None,
                        help='The file holding block_emb (default: the '
                        'source that does).')
  released.add_argument('--corpus_name', default=None,
                        help='Written to $REALM_CORPUS_DIR/<name> (default: '
                        'enwiki_20181220).')
  released.add_argument('--benchmark', default=None,
                        help='The Open-QA task of a fine-tuned model '
                        '(default: nq_open).')
  released.add_argument('--gin_file', action='append', default=[])
  released.add_argument('--gin_bindings', action='append', default=[])


# What only the released files' import reads: refused beside --export.
_RELEASED_ONLY = ('source', 'blocks', 'titles', 'block_emb', 'corpus_name',
                  'benchmark', 'gin_file', 'gin_bindings')


def run(args) -> None:
  common.check_output_dir(args.model_dir, '--model_dir')
  if args.export:
    ignored = [f'--{name}' for name in _RELEASED_ONLY if getattr(args, name)]
    if ignored:
      raise errors.BadConfig(f'--export reads a whole export; give it without '
                             f'{", ".join(ignored)}.')
    from realm_jax.export import loading  # pylint: disable=g-import-not-at-top
    summary = loading.import_export(args.export, args.model_dir)
    print(f'imported the {summary["kind"]} run at step {summary["step"]} '
          f'(index step {summary["index_step"]}) into {summary["model_dir"]}')
    return
  if not args.source or not args.blocks:
    raise errors.BadConfig('import needs --source and --blocks (released '
                           'REALM), or --export.')
  from realm_jax.released import importer  # pylint: disable=g-import-not-at-top
  summary = importer.import_released(
      args.model_dir, args.source, args.blocks, block_emb=args.block_emb,
      titles=args.titles, gin_files=args.gin_file,
      gin_bindings=args.gin_bindings, **{  # Else the importer's defaults.
          name: getattr(args, name) for name in ('corpus_name', 'benchmark')
          if getattr(args, name)})
  print(f'imported a {summary["kind"]} run into {summary["model_dir"]} '
        f'({summary["num_blocks"]:,} blocks, corpus '
        f'{summary["corpus_dir"]})')
