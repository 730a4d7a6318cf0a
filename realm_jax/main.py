"""The `realm-jax` command line."""

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import sys
import traceback

from realm_jax import errors

# Set (to anything but 0) to see the traceback of a user error too.
DEBUG_ENV = 'REALM_JAX_DEBUG'
# Where every command keeps what XLA compiled, for the next process (default
# ~/.cache/realm-jax/xla; 'off': nowhere): see `use_compilation_cache`.
CACHE_ENV = 'REALM_JAX_CACHE'
# Commands that start without it: `aot` picks JAX's platform before JAX
# loads (and compiles for devices this machine fakes); `data` and `corpus`
# compile nothing, and fork workers.
UNCACHED = ('aot', 'data', 'corpus')
# Reported by --version: realm-jax's own and the packages it runs on.
PACKAGES = ('realm-jax', 'jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint',
            'seqio', 'tensorflow-text', 'scann', 'gin-config')


class _Version(argparse.Action):
  """Prints what --version promises, then exits."""

  def __call__(self, parser, namespace, values, option_string=None):
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    for package in PACKAGES:
      try:
        version = metadata.version(package)
      except metadata.PackageNotFoundError:
        version = 'not installed'
      print(f'{package} {version}')
    import jax  # pylint: disable=g-import-not-at-top
    print('devices: ' + ', '.join(str(d) for d in jax.devices()))
    parser.exit()


def _one_or_many_arguments(command, single: tuple[str, str],
                           many: tuple[str, str, str], model_dir: str,
                           row: str, written: str) -> None:
  """A command's input, one on the command line or a file of them, its run
  and its JSONL output: `single` (name, example), `many` (flag, what the
  file holds, what is done to them)."""
  inputs = command.add_mutually_exclusive_group(required=True)
  inputs.add_argument(single[0], nargs='?', help=single[1])
  flag, plural, done = many
  inputs.add_argument(flag, default=None,
                      help=f'A file of {plural}, one a line ("-": standard '
                      f'input), {done} by one loaded model.')
  command.add_argument('--model_dir', required=True, help=model_dir)
  command.add_argument('--output', default=None,
                       help=f'Also write one JSON object per {row} here '
                       f'(JSONL): {written}.')


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='realm-jax',
      description='REALM retrieval-augmented pre-training in JAX.',
      epilog='A user error (a missing run, a bad file, bad gin) is one line '
      'and exit code 2; --debug, or $REALM_JAX_DEBUG=1, adds its traceback.')
  parser.add_argument('--version', action=_Version, nargs=0,
                      help="realm-jax's version, the packages it runs on "
                      'and the devices JAX sees.')
  # --debug and --verbose after the command too; SUPPRESS keeps a missing
  # one from overriding a given one.
  common = argparse.ArgumentParser(add_help=False)
  for flag, help_text in (
      ('--debug', 'Show the traceback of a user error too.'),
      ('--verbose', "Show the libraries' set-up lines too (TensorFlow's C++ "
       "log, seqio's and Orbax's notices); also $REALM_JAX_VERBOSE=1.")):
    parser.add_argument(flag, action='store_true', help=help_text)
    common.add_argument(flag, action='store_true', default=argparse.SUPPRESS,
                        help=help_text)
  commands = parser.add_subparsers(dest='command', required=True)
  command = functools.partial(commands.add_parser, parents=[common])

  demo = command(
      'demo', help='REALM in miniature on the embedded default: corpus, '
      'ICT, the reader\'s warm start, pre-training with the index builder '
      'beside it against a trained no-retrieval baseline, every comparison '
      'with a paired bootstrap interval (recall needs $REALM_DATA_DIR). '
      'Finished stages are skipped on a re-run.')
  demo.add_argument('--work_dir', default=None,
                    help='Every run, index and result (default: '
                    'runs/<preset>).')
  demo.add_argument('--record', action='store_true',
                    help='Also write the report into docs/results/<preset>.* '
                    '(a source tree\'s record, which the next run of the '
                    'preset plans from); without it nothing outside '
                    '--work_dir changes.')
  demo.add_argument('--repeats', type=int, default=1,
                    help='Run the preset this many times, seeds 0 to N-1, '
                    'each under <work_dir>/seed_<s>, and report each '
                    'figure\'s mean and range and each comparison\'s '
                    'interval in every run.')
  demo.add_argument('--lockstep', action='store_true',
                    help='The trainer retrieves from the index of a fixed '
                    'earlier step, waited for if late, instead of the newest '
                    'one the builder has published: a run then depends on '
                    'its seed alone, not on the builder\'s speed (world '
                    'presets).')
  demo.add_argument('--preset', choices=('demo', 'reproduce', 'end_to_end',
                                         'gpu', 'world', 'world_top3',
                                         'world_warmup30', 'world_small'),
                    default='demo',
                    help='demo: the two core checks (20 minutes on 2 cores); '
                    'reproduce: the miniature Table 2 (90 minutes); '
                    'end_to_end: the demo, then NQ fine-tuning with the '
                    'document tower frozen and trained (--work_dir=runs/demo '
                    'reuses the demo\'s stages); gpu: the demo at '
                    'accelerator size on one GPU, from a bundle (make '
                    'bundle-gpu; docs/accelerators.md); world: REALM\'s '
                    'four claims in a controlled knowledge world, where each '
                    'fact is in '
                    'one document; world_top3 and world_warmup30: the same '
                    'with the null document and the top 3 (8 in all by '
                    'default), and with REALM\'s warmup over 30 steps (100 '
                    'by default); '
                    'world_small: its REALM and baseline alone, '
                    'in a smaller world (the learning test\'s).')

  data = command('data', help='Build and annotate corpora.')
  steps = data.add_subparsers(dest='step', required=True)
  step = functools.partial(steps.add_parser, parents=[common])
  build = step(
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
  annotate = step(
      'annotate', help='Find salient spans (entities, dates) in a corpus.')
  annotate.add_argument('--corpus_dir', default=None,
                        help='Default: the wiki_leads corpus directory.')
  annotate.add_argument('--vocab', default=None)
  annotate.add_argument('--num_processes', type=int,
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

  def add_gin(command, default_gin):
    command.add_argument('--gin_file', action='append', default=None,
                         help=f'gin config (repeatable; default {default_gin}).')
    command.add_argument('--gin_bindings', action='append', default=[],
                         help="e.g. \"BertConfig.dtype = 'bfloat16'\".")

  embed = command(
      'embed', help='Embed every block of a corpus with the document tower.')
  embed.add_argument('--corpus_dir', default=None,
                     help='Default: the wiki_leads corpus directory.')
  embed.add_argument('--output_dir', default=None,
                     help='Index directory (default: model_dir/index, else '
                     'runs/embed/index).')
  embed.add_argument('--model_dir', default=None,
                     help='Use the newest trainer checkpoint here; default: '
                     'warm start the towers from --bert_dir.')
  embed.add_argument('--bert_dir', default=None,
                     help='HF-format BERT weights (default: embedded MiniLM).')
  embed.add_argument('--batch_size', type=int, default=64)
  add_gin(embed, 'gin/models/minilm_l6.gin')

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

  fill = command(
      'fill', help='Fill the [MASK]s of a sentence with a pre-training run, '
      'showing the documents it retrieved and how each one votes.')
  _one_or_many_arguments(
      fill, ('text', 'e.g. "The [MASK] is the currency of the United '
             'Kingdom."'), ('--texts', 'sentences', 'filled'),
      'A `realm-jax train` pre-training run.', 'sentence', 'the filled '
      'text, p(y|x) of each [MASK], and each document with p(z|x) and '
      'p(y|z,x)')

  evaluate = command(
      'eval', help='Score a run on an Open-QA test set (a benchmark\'s, or '
      'any file of questions) through seqio.Evaluator: exact match (regex '
      'match for CuratedTREC) of a fine-tuning run, and the top-1/5/20/100 '
      'retrieval accuracy of any run (DPR\'s has_answer).')
  evaluate.add_argument('--model_dir', required=True,
                        help='A `realm-jax train` run (ICT, pre-training or '
                        'fine-tuning).')
  evaluate.add_argument('--task', action='append', default=[],
                        choices=('nq_open', 'web_questions', 'curated_trec',
                                 'masked_lm'),
                        help='Repeatable. masked_lm: held-out masked '
                        'salient-span accuracy of a pre-training run.')
  evaluate.add_argument('--qa_file', action='append', default=[],
                        help='Repeatable. Any Open-QA file, every question '
                        "scored: topics TSV (question<TAB>['answer', ...]) "
                        'or JSONL ({"question": ..., "answer": [...]}), '
                        'told by its first row, else by its extension '
                        '(.tsv, .jsonl). Its files are named by its task, '
                        'qa_file_<stem>_<hash of the content>.')
  evaluate.add_argument('--qa_regex', action='store_true',
                        help='The answers of the --qa_file(s) are regular '
                        'expressions, scored by regex match as CuratedTREC '
                        "is (the task's name gets _regex).")
  evaluate.add_argument('--output_dir', default=None,
                        help='Default: model_dir/eval.')
  evaluate.add_argument('--top_k', type=int, default=100,
                        help='Blocks retrieved per question (at most every '
                        'block); top-k accuracy is reported for k = 1, 5, '
                        '20 and 100 up to it.')
  evaluate.add_argument('--retrieval_output', default=None, metavar='FILE',
                        help="Also write the retrievals (each question's "
                        'top_k blocks with id, title, text, score and '
                        'has_answer) as the JSON that DPR\'s retriever '
                        'writes, for its and Pyserini\'s scorers '
                        '(--retrieval_format); one task.')
  evaluate.add_argument('--retrieval_format', default='dpr',
                        choices=('dpr', 'pyserini', 'trec'),
                        help="--retrieval_output's layout: DPR's list with "
                        "'ctxs'; the question-keyed object with 'contexts' "
                        "that Pyserini's evaluate_dpr_retrieval reads; or a "
                        'TREC run, `qid Q0 docid rank score tag` lines '
                        "(qid the question's number, docid the block id) "
                        "that trec_eval and Pyserini's trec_eval read.")
  evaluate.add_argument('--step', type=int, default=None,
                        help='Checkpoint to score (default: the newest).')
  evaluate.add_argument('--batch_size', type=int, default=32)
  evaluate.add_argument('--num_examples', type=int, default=None,
                        help='Only the first N questions (quick looks).')
  add_gin(evaluate, "the run's model_dir/config.gin alone; files given here "
          'are layered over it')

  ask = command(
      'ask', help='Answer a question with a fine-tuning run, showing the '
      'blocks it read and how each one supports the answer.')
  _one_or_many_arguments(
      ask, ('question', 'e.g. "who wrote the origin of species?"'),
      ('--questions', 'questions', 'answered'),
      'A `realm-jax train` fine-tuning run.', 'question', 'the answer, its '
      'probability, the runners-up and each block with p(z|x) and p(y|z,x)')

  search = command(
      'search', help="Retrieve with any run's retriever (ICT, pre-training, "
      'fine-tuning, or MiniLM\'s warm start): the top blocks of a query with '
      'their scores and p(z|x) over them. The quickest look at what a '
      'retriever learned.')
  _one_or_many_arguments(
      search, ('query', 'e.g. "origin of species author"'),
      ('--queries', 'queries', 'searched'),
      'A `realm-jax train` run of any kind.', 'query', 'each block with its '
      'id, title, opening words, score and p(z|x)')
  search.add_argument('--top_k', type=int, default=5,
                      help='Blocks shown per query (at most every block).')

  refresh = command(
      'refresh', help='The index builder: re-embed and publish every new '
      'trainer checkpoint until training is done.')
  refresh.add_argument('--model_dir', required=True)
  refresh.add_argument('--corpus_dir', default=None)
  refresh.add_argument('--searcher', choices=('exact', 'scann'),
                       default='exact')
  refresh.add_argument('--poll_seconds', type=float, default=2.0)
  refresh.add_argument('--batch_size', type=int, default=64)
  add_gin(refresh, 'gin/models/minilm_l6.gin')

  aot = command(
      'aot', help='Compile the train step, the index builder\'s embedding '
      'step and exact search for a target mesh (abstract inputs: nothing '
      'allocated) and print per-device memory and FLOPs: faked CPU devices '
      '(--target=cpu), or a TPU slice compiled by XLA:TPU on this machine '
      '(--target=tpu:v4:4x4x4; needs libtpu, which make setup installs in '
      '.venv/libtpu).',
      epilog='e.g. realm-jax aot --gin_file=gin/setups/paper_scale.gin '
      '--mesh=64, or --target=tpu:v4:4x4x4 --builder_mesh=16')
  aot.add_argument('--target', type=_aot_target, default='cpu',
                   help="'cpu' (faked CPU devices) or 'tpu:<topology>', e.g. "
                   "tpu:v4:2x2x1 (v4, v5e, v5p or v6e; one device a chip).")
  aot.add_argument('--mesh', type=int, default=None,
                   help="The trainer's device count (needed for --target=cpu;"
                   " a TPU target's default: every chip of the topology).")
  aot.add_argument('--builder_mesh', type=int, default=None,
                   help="The index builder's device count (default: 16, or "
                   "every chip of a TPU topology with fewer).")
  aot.add_argument('--run', choices=('pretrain', 'ict', 'finetune'),
                   default='pretrain',
                   help='gin/runs/<run>.gin, read before the --gin_file(s).')
  aot.add_argument('--model_dir', default=None,
                   help="Compile a training run's own config (its "
                   'config.gin, the --gin_file(s) layered over it) instead '
                   'of --run.')
  aot.add_argument('--device_memory_gib', type=float, default=None,
                   help='One device\'s memory (default: a TPU chip\'s HBM, '
                   'and 32 GiB, a TPU v4\'s, for --target=cpu).')
  aot.add_argument('--output', default=None,
                   help='Also write the figures here as JSON.')
  aot.add_argument('--gin_file', action='append', default=[])
  aot.add_argument('--gin_bindings', action='append', default=[])

  released = command(
      'import', help="Google's released REALM (TF-Hub modules, ORQA "
      "checkpoints or Hugging Face's port) as a run directory, with a "
      'published index of the released block embeddings and a corpus of '
      'the released blocks (docs/released.md).',
      epilog='e.g. realm-jax import --model_dir=runs/orqa_nq '
      '--source=orqa_nq_model_from_realm/export/best_default/checkpoint/'
      'model.ckpt-300000 --block_emb=cc_news_pretrained/embedder/encoded/'
      'encoded.ckpt --blocks=enwiki-20181220/blocks.tfr '
      '--titles=enwiki-20181220/titles.tfr')
  released.add_argument('--model_dir', required=True,
                        help='The run directory to write (must not exist).')
  released.add_argument('--source', action='append', required=True,
                        help='Released weights (repeatable): a TF checkpoint '
                        'prefix, a TF-Hub module or Hugging Face directory, '
                        'a .bin or .safetensors file; local or gs://.')
  released.add_argument('--blocks', required=True,
                        help='blocks.tfr or block_records.npy.')
  released.add_argument('--titles', default=None, help='titles.tfr.')
  released.add_argument('--block_emb', default=None,
                        help='The file holding block_emb (default: the '
                        'source that does).')
  released.add_argument('--corpus_name', default='enwiki_20181220',
                        help='Written to $REALM_CORPUS_DIR/<name>.')
  released.add_argument('--benchmark', default='nq_open',
                        help='The Open-QA task of a fine-tuned model.')
  released.add_argument('--gin_file', action='append', default=[])
  released.add_argument('--gin_bindings', action='append', default=[])

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
  living.add_argument('--batch_size', type=int, default=64)
  return parser


def _parse_gin(args) -> None:
  """The command's gin files (default MiniLM's) and bindings.

  The bindings are parsed one at a time, so that one gin cannot take stops
  the command with a ValueError naming it: gin's parser raises SyntaxError,
  TypeError, tokenize.TokenError, RecursionError and more, most of them
  saying neither which binding nor that it was one.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  run_loader.parse_gin(args.gin_file or [
      os.path.join(run_loader.GIN_DIR, 'models', 'minilm_l6.gin')],
                       finalize=False)
  for binding in args.gin_bindings:
    try:
      run_loader.parse_gin([], [binding], finalize=False)
    except errors.BadConfig as error:
      raise errors.BadConfig(f'gin binding {binding!r}: '
                             f'{errors.one_line(error.__cause__)}') from error
    except Exception as error:  # pylint: disable=broad-except
      raise errors.BadConfig(
          f'gin binding {binding!r}: {errors.one_line(error)}') from error
  try:
    gin.finalize()
  except ValueError as error:  # An undefined %MACRO, say.
    raise errors.BadConfig(
        (f'gin bindings {", ".join(map(repr, args.gin_bindings))}: '
         if args.gin_bindings else 'gin: ') + errors.one_line(error)
    ) from error


def _train(args) -> None:
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  _parse_gin(args)
  run_loader.train(args.model_dir)


@contextlib.contextmanager
def _one_or_many(command: str, single: str | None, path: str | None,
                 output_path: str | None):
  """(inputs [(file:line or None, text)], skip report, write(row)) of a
  command given one text or a file of them ('-': standard input); write
  prints nothing itself: it appends a JSONL row to `output_path`, if any,
  and flushes what was printed, so that piped output comes as it goes. An
  empty text is refused before any model loads."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax.data.skips import SkipReport  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation.prediction import read_inputs  # pylint: disable=g-import-not-at-top
  report = SkipReport(f'{command} {path}')
  if path is None and not single.strip():
    raise errors.BadInput(f'Nothing to {command}: the text given is empty.')
  inputs = [(None, single)] if path is None else read_inputs(path, report)
  with contextlib.ExitStack() as files:
    output = output_path and files.enter_context(
        epath.Path(output_path).open('w'))

    def write(row: dict) -> None:
      if output:
        output.write(json.dumps(row) + '\n')
        output.flush()
      sys.stdout.flush()

    yield inputs, report, write
  if report:
    print(report.summary(), file=sys.stderr)


def use_compilation_cache() -> str | None:
  """JAX's persistent compilation cache, one directory on disk for every
  process: what one compiled, the next reads instead of compiling it again.
  A command answering one input starts without compiling; a run's trainer
  and index builder (realm_jax.launch_local's two processes, which inherit the
  environment), a run resumed, and the demos' trainings in a row (the
  no-retrieval baseline and the ablations compile REALM's step again) read
  what the first compiled. Returns the directory, None when 'off'."""
  import jax  # pylint: disable=g-import-not-at-top
  directory = os.environ.get(CACHE_ENV) or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'),
      'realm-jax', 'xla')
  if directory == 'off':
    return None
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return directory


def _fill(args) -> None:
  from realm_jax.evaluation.prediction import ClozePredictor  # pylint: disable=g-import-not-at-top
  with _one_or_many('fill', args.text, args.texts, args.output) as (
      texts, report, write):
    predictor, filled = ClozePredictor(args.model_dir), 0
    for where, text in texts:
      try:
        result = predictor.fill(text)
      except errors.BadInput as error:  # No [MASK], or longer than the query:
        if where is None:  # a line of a file is skipped and counted.
          raise
        print(f'{where}: {error}', file=sys.stderr)
        report.add('not fillable', where)
        continue
      if filled:
        print()
      filled += 1
      print(f'filled: {result["filled"]}   (index step '
            f'{result["index_step"]})')
      for j, tokens in enumerate(result['masks'], 1):
        print(f'[MASK] {j}: p(y|x) ' + '  '.join(f'{t} {p:.3f}'
                                                 for t, p in tokens))
      print(f'{"p(z|x)":>7} {"p(y|z,x)":>9}  document')
      for doc in result['documents']:
        p_y = ' '.join(f'{p:.3f}' for p in doc['p_y_given_z'])
        print(f'{doc["p_z"]:7.3f} {p_y:>9}  {doc["title"]}: {doc["text"]}')
      write({'text': text, **result})


def _eval(args) -> None:
  from realm_jax.evaluation import masked_lm, qa_evaluation  # pylint: disable=g-import-not-at-top
  from realm_jax.data import open_qa  # pylint: disable=g-import-not-at-top
  if not args.task and not args.qa_file:
    raise errors.BadConfig('Nothing to score.', 'Give a --task or a '
                           '--qa_file.')
  if args.qa_regex and not args.qa_file:
    raise errors.BadConfig('--qa_regex is about the answers of a --qa_file; '
                           'give one.')
  # Before the model loads: a file of no known format is refused.
  for path in args.qa_file:
    open_qa.qa_file_format(path)
  gin_files = args.gin_file or ()
  output_dir = args.output_dir or os.path.join(args.model_dir, 'eval')
  tasks = [t for t in args.task if t != 'masked_lm']
  if args.retrieval_output and len(tasks) + len(args.qa_file) != 1:
    raise errors.BadConfig('--retrieval_output is one file; give one QA '
                           f'task, not {len(tasks) + len(args.qa_file)}.')
  _check_top_k(args.top_k)
  if 'masked_lm' in args.task:
    summary = masked_lm.evaluate(args.model_dir, output_dir, 'masked_lm',
                                 gin_files, args.gin_bindings, args.batch_size,
                                 step=args.step)
    print('masked_lm: ' + ', '.join(f'{k} {v}' for k, v in summary.items()))
  predictor = (tasks or args.qa_file) and qa_evaluation.QAPredictor(
      args.model_dir, args.step, gin_files, args.gin_bindings, args.top_k)
  tasks += [qa_evaluation.QAFile(path, args.qa_regex)
            for path in args.qa_file]
  for task in tasks:
    summary = qa_evaluation.evaluate(
        predictor, task, output_dir, args.batch_size, args.num_examples,
        args.retrieval_output, args.retrieval_format)
    print(f'{summary["task"]} ({predictor.kind} step {predictor.step}, '
          f'index step {summary["index_step"]}): ' + ', '.join(
              f'{k} {v:.2f}' if isinstance(v, float) else f'{k} {v}'
              for k, v in summary.items() if k not in (
                  'task', 'model_dir', 'run_kind', 'step', 'index_step')))
  print(f'predictions and metrics in {output_dir}')


def _ask(args) -> None:
  from realm_jax.evaluation.prediction import QAPredictor  # pylint: disable=g-import-not-at-top
  with _one_or_many('ask', args.question, args.questions, args.output) as (
      questions, _, write):
    # It reads its candidates, whatever top_k.
    predictor = QAPredictor(args.model_dir, top_k=1, answers_only=True)
    for n, (_, question) in enumerate(questions):
      result = predictor.ask(question)
      if n:
        print()
      print(f'Q: {result["question"]}')
      label = 'p(z,s|x)' if result['answer_rule'] == 'best_span' else 'p(y|x)'
      print(f'A: {result["answer"]}   {label} = {result["p_answer"]:.3f}   '
            f'(step {result["step"]}, index step {result["index_step"]})')
      if result['alternatives']:
        print('   else: ' + '  '.join(f'{t} {p:.3f}'
                                      for t, p in result['alternatives']))
      print(f'{"p(z|x)":>7} {"p(y|z,x)":>9}  block')
      for block in result['blocks']:
        print(f'{block["p_z"]:7.3f} {block["p_y_given_z"]:9.3f}  '
              f'{block["title"]}: {block["text"]}')
      write(result)


def _check_top_k(top_k: int) -> None:
  if top_k < 1:
    raise errors.BadConfig(f'--top_k {top_k}: give 1 or more.')


def _search(args) -> None:
  from realm_jax.evaluation.prediction import QAPredictor  # pylint: disable=g-import-not-at-top
  _check_top_k(args.top_k)
  with _one_or_many('search', args.query, args.queries, args.output) as (
      queries, _, write):
    predictor = QAPredictor(args.model_dir, top_k=args.top_k, read=False)
    for n, (_, query) in enumerate(queries):
      result = predictor.search(query)
      if n:
        print()
      print(f'Q: {query}   ({result["kind"]} step {result["step"]}, index '
            f'step {result["index_step"]})')
      print(f'{"rank":>4} {"score":>8} {"p(z|x)":>7}  block')
      for rank, block in enumerate(result['blocks'], 1):
        print(f'{rank:4d} {block["score"]:8.3f} {block["p_z"]:7.3f}  '
              f'{block["title"]}: {block["text"]}')
      write(result)


def _demo(args) -> None:
  from realm_jax.experiments import demo  # pylint: disable=g-import-not-at-top
  work_dir = args.work_dir or os.path.join('runs', args.preset)
  docs_dir = os.fspath(demo.DOCS_RESULTS) if args.record else None
  if args.repeats < 1:
    raise errors.BadConfig(f'--repeats={args.repeats}: at least 1.')
  if args.preset.startswith('world'):
    from realm_jax.experiments import world_demo  # pylint: disable=g-import-not-at-top
    if args.repeats > 1:
      world_demo.run_repeats(work_dir, args.preset, docs_dir, args.repeats,
                             args.lockstep)
    else:
      world_demo.run(work_dir, args.preset, docs_dir, lockstep=args.lockstep)
    return
  if args.lockstep:
    raise errors.BadConfig(f'--lockstep is for the world presets, not '
                           f'--preset={args.preset}.')
  if args.repeats > 1:
    demo.run_repeats(work_dir, args.preset, docs_dir, args.repeats)
  else:
    demo.run(work_dir, args.preset, docs_dir)


def _gin_flags(argv):
  """`--gin.X=V` flags -> `--gin_bindings=X = V`."""
  out = []
  for arg in argv:
    if arg.startswith('--gin.') and '=' in arg:
      name, value = arg[len('--gin.'):].split('=', 1)
      out.append(f'--gin_bindings={name} = {value}')
    else:
      out.append(arg)
  return out


def _corpus_dir(args) -> str:
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  return args.corpus_dir or corpus.corpus_dir('wiki_leads')


def _embed(args) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax import embedded, run_directory  # pylint: disable=g-import-not-at-top
  from realm_jax.data.open_corpus import OpenCorpus  # pylint: disable=g-import-not-at-top
  from realm_jax.index import embed, publication  # pylint: disable=g-import-not-at-top
  from realm_jax.models import pretrained  # pylint: disable=g-import-not-at-top
  from realm_jax.models.realm import model_retriever  # pylint: disable=g-import-not-at-top
  from realm_jax.models.retriever import init_retriever_params  # pylint: disable=g-import-not-at-top
  _parse_gin(args)
  retriever = model_retriever()
  opened = OpenCorpus(_corpus_dir(args))
  if args.model_dir:
    checkpoints = run_directory.trainer_checkpoints(args.model_dir)
    step, params = run_directory.newest(checkpoints, functools.partial(
        run_directory.restore_retriever_params, checkpoints))
    if step is None:
      raise errors.NotFound(f'No trainer checkpoint in {args.model_dir}.')
  else:
    step = 0  # The warm start: pretrained BERT towers, fresh projection.
    bert = pretrained.load_bert_params(args.bert_dir or embedded.minilm_dir(),
                                       retriever.config)
    params = init_retriever_params(retriever, jax.random.key(0), bert)
  output = args.output_dir or run_directory.index_dir(
      args.model_dir or os.path.join('runs', 'embed'))
  publication.embed_and_publish(
      publication.index_manager(output), step,
      embed.DocumentEmbedder(retriever, args.batch_size), params,
      embed.local_block_arrays(opened), opened.metadata)
  print(f'index step {step} ({retriever.config.dtype.name}) in {output}')


def _refresh(args) -> None:
  from realm_jax.index import refresh  # pylint: disable=g-import-not-at-top
  _parse_gin(args)
  refresh.run_refresh(args.model_dir, _corpus_dir(args), args.searcher,
                      args.poll_seconds, args.batch_size)


def _aot_target(value: str) -> str:
  """--target: 'cpu' or 'tpu:<topology>'."""
  if value != 'cpu' and not (value.startswith('tpu:') and len(value) > 4):
    raise argparse.ArgumentTypeError(
        f"{value!r}: 'cpu' or 'tpu:<topology>' (e.g. tpu:v4:2x2x1)")
  return value


def _aot(args) -> None:
  tpu = args.target.startswith('tpu:')
  if not tpu and args.mesh is None:
    raise errors.BadConfig('--target=cpu needs --mesh, the trainer\'s '
                           'device count.')
  builder_mesh = args.builder_mesh or 16
  # Before JAX starts: its own devices are the host's CPUs, faked to the
  # target mesh's size for XLA:CPU; a TPU target's devices are libtpu's.
  os.environ['JAX_PLATFORMS'] = 'cpu'
  if not tpu:
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_'
        f'device_count={max(args.mesh, builder_mesh)}')
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax import aot  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  if tpu:
    target = aot.tpu_target(args.target[len('tpu:'):])
    mesh = args.mesh or len(target.devices)
    if args.builder_mesh is None:
      builder_mesh = min(builder_mesh, len(target.devices))
    memory_gib = args.device_memory_gib or target.chip.hbm_gib
  else:
    target = aot.cpu_target()
    mesh, memory_gib = args.mesh, args.device_memory_gib or 32.0
  # The accelerators' attention, not the faked CPU devices' loop.
  args.gin_bindings = ['BertConfig.attention_chunk = 0', *args.gin_bindings]
  if args.model_dir:
    configured = run_loader.load_run(args.model_dir, args.gin_file,
                                     args.gin_bindings)
  else:
    args.gin_file = [os.path.join(run_loader.GIN_DIR, 'runs',
                                  f'{args.run}.gin'), *args.gin_file]
    _parse_gin(args)
    configured = run_loader.configured_run()
  programs = aot.compile_and_fit(configured.run, configured.batch_size,
                                 configured.num_steps, mesh, builder_mesh,
                                 target=target)
  print(aot.caption(target, memory_gib))
  print(aot.table(programs, memory_gib, target))
  if args.output:
    epath.Path(args.output).write_text(json.dumps(
        aot.report(programs, target, mesh, builder_mesh, memory_gib),
        indent=2))
  over = [p.name for p in programs if p.total_bytes >= memory_gib * aot.GIB]
  if over:
    raise errors.BadConfig(
        f'Does not fit in {memory_gib:g} GiB per '
        f'{"chip" if target.chip else "device"}: {", ".join(over)} '
        f'({target.description}).')


def _import(args) -> None:
  from realm_jax.released import importer  # pylint: disable=g-import-not-at-top
  summary = importer.import_released(
      args.model_dir, args.source, args.blocks, block_emb=args.block_emb,
      titles=args.titles, corpus_name=args.corpus_name,
      benchmark=args.benchmark, gin_files=args.gin_file,
      gin_bindings=args.gin_bindings)
  print(f'imported a {summary["kind"]} run into {summary["model_dir"]} '
        f'({summary["num_blocks"]:,} blocks, corpus '
        f'{summary["corpus_dir"]})')


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
  elif args.step == 'export':
    from realm_jax.data import block_store  # pylint: disable=g-import-not-at-top
    from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
    _parse_gin(args)
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
    made = world_demo.make_world(world.WorldSpec(**given))
    print(f'{made["blocks"]:,} documents in {made["corpus_dir"]}')
  elif args.step == 'annotate':
    from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
    salient_spans.annotate_corpus(
        args.corpus_dir or corpus.corpus_dir('wiki_leads'),
        _tokenizer(args.vocab), num_processes=args.num_processes)


def _corpus(args) -> None:
  from realm_jax.data import corpus, corpus_changes  # pylint: disable=g-import-not-at-top
  from realm_jax.index import corpus_sync  # pylint: disable=g-import-not-at-top
  from realm_jax.training import batches, run_loader  # pylint: disable=g-import-not-at-top
  loaded = run_loader.load_run(args.model_dir)
  corpus_dir = corpus.corpus_dir(loaded.run.corpus_name)
  if args.action == 'add':
    if not args.jsonl:
      raise errors.BadConfig('Nothing to add.', 'Give --jsonl=FILE.')
    # The index must fit the corpus before it changes.
    corpus_sync.sync_index(loaded.model_dir, corpus_dir, loaded.run.retriever(),
                           args.batch_size)
    _, added = corpus_changes.add_articles(
        corpus_dir, batches.task_tokenizer(), args.jsonl)
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


COMMANDS = {'demo': _demo, 'data': _data, 'embed': _embed,
            'refresh': _refresh, 'train': _train, 'fill': _fill,
            'eval': _eval, 'ask': _ask, 'search': _search, 'aot': _aot,
            'import': _import, 'corpus': _corpus}
# Commands that read and print, and leave nothing to write when they return.
READ_ONLY = ('ask', 'fill', 'search')


def main(argv=None, exit_at_once: bool = False) -> int:
  """Runs a command: 0 when it succeeds; a user error (`errors.UserError`)
  printed in a line or two, 2; a bug propagates with its traceback.

  `exit_at_once` (the `realm-jax` program): after a read-only command the
  process exits as soon as its output is flushed. Tearing the interpreter
  down (TensorFlow's and XLA's objects) takes about a second, a fifth of
  the time a question's answer takes.
  """
  args = _parser().parse_args(_gin_flags(sys.argv[1:] if argv is None
                                         else argv))
  from realm_jax import quiet  # pylint: disable=g-import-not-at-top
  quiet.quiet(args.verbose)  # Before JAX and TensorFlow start.
  from realm_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.log_to_stderr()
  if getattr(args, 'model_dir', None) and '://' not in args.model_dir:
    args.model_dir = os.path.abspath(args.model_dir)  # Orbax needs these.
  if args.command not in UNCACHED:
    use_compilation_cache()
  try:
    COMMANDS[args.command](args)
  except errors.UserError as error:
    if args.debug or os.environ.get(DEBUG_ENV, '0') not in ('', '0'):
      traceback.print_exc()
    print(f'realm-jax {args.command}: {errors.message(error)}',
          file=sys.stderr)
    return 2
  if exit_at_once and args.command in READ_ONLY:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)  # pylint: disable=protected-access
  return 0


def run() -> None:
  """The `realm-jax` program."""
  sys.exit(main(exit_at_once=True))


if __name__ == '__main__':
  run()
