"""`realm-jax embed`: every block of a corpus embedded with the document
tower."""

import functools
import os

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'embed'


def add_parser(command, flags) -> None:
  del flags
  embed = command(
      'embed', help='Embed every block of a corpus with the document tower.')
  embed.add_argument('--corpus_dir', default=None,
                     help="Default: the run's corpus with --model_dir, else "
                     'the wiki_leads corpus directory.')
  embed.add_argument('--output_dir', default=None,
                     help='Index directory (default: model_dir/index, else '
                     'runs/embed/index).')
  embed.add_argument('--model_dir', default=None,
                     help='Use the newest trainer checkpoint here, built as '
                     "the run's config.gin says (--gin_file and "
                     '--gin_bindings layered over it); default: warm start '
                     'the towers from --bert_dir.')
  embed.add_argument('--bert_dir', default=None,
                     help='HF-format BERT weights (default: embedded MiniLM).')
  embed.add_argument('--batch_size', type=common.positive(int), default=64)
  common.add_gin(embed, 'gin/models/minilm_l6.gin')


def run(args) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax import default_files, run_directory  # pylint: disable=g-import-not-at-top
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  from realm_jax.data.open_corpus import OpenCorpus  # pylint: disable=g-import-not-at-top
  from realm_jax.index import embed, publication  # pylint: disable=g-import-not-at-top
  from realm_jax.models import pretrained  # pylint: disable=g-import-not-at-top
  from realm_jax.models.realm import model_retriever  # pylint: disable=g-import-not-at-top
  from realm_jax.models.retriever import init_retriever_params  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  if args.output_dir:
    common.check_output_dir(args.output_dir, '--output_dir')
  if args.model_dir:
    # The run's own towers: a model the defaults do not describe would fail
    # to restore, or restore and embed as another model would.
    loaded = run_loader.load_run(args.model_dir, args.gin_file or (),
                                 args.gin_bindings)
    retriever = loaded.run.retriever()
    opened = OpenCorpus(args.corpus_dir or
                        corpus.corpus_dir(loaded.run.corpus_name))
    block_length = getattr(loaded.run, 'block_length', None)
    checkpoints = run_directory.trainer_checkpoints(args.model_dir)
    step, params = run_directory.newest(checkpoints, functools.partial(
        run_directory.restore_retriever_params, checkpoints))
    if step is None:
      raise errors.NotFound(f'No trainer checkpoint in {args.model_dir}.')
  else:
    common.parse_gin(args)
    retriever = model_retriever()
    opened = OpenCorpus(common.corpus_dir(args))
    block_length = None
    step = 0  # The warm start: pretrained BERT towers, fresh projection.
    bert = pretrained.load_bert_params(args.bert_dir or default_files.minilm_dir(),
                                       retriever.config)
    params = init_retriever_params(retriever, jax.random.key(0), bert)
  output = args.output_dir or run_directory.index_dir(
      args.model_dir or os.path.join('runs', 'embed'))
  index = publication.index_manager(output)
  if step in index.all_steps():  # Refused now, not after the embedding.
    raise errors.BadInput(
        f'{output} already holds index step {step}.',
        'Give another --output_dir, or remove that step first.')
  publication.embed_and_publish(
      index, step,
      embed.DocumentEmbedder(retriever, args.batch_size), params,
      embed.local_block_arrays(opened, block_length), opened.metadata)
  print(f'index step {step} ({retriever.config.dtype.name}) in {output}')
