"""What the commands share: their inputs given one at a time or as a file,
their gin flags, and the checks made before a model loads."""

import contextlib
import json
import os
import sys

from realm_jax import errors


def one_or_many_arguments(command, single: tuple[str, str],
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


def gin_flags(argv):
  """`--gin.X=V` flags -> `--gin_bindings=X = V`."""
  out = []
  for arg in argv:
    if arg.startswith('--gin.') and '=' in arg:
      name, value = arg[len('--gin.'):].split('=', 1)
      out.append(f'--gin_bindings={name} = {value}')
    else:
      out.append(arg)
  return out


def add_gin(command, default_gin: str) -> None:
  """--gin_file and --gin_bindings, for a command that reads gin."""
  command.add_argument('--gin_file', action='append', default=None,
                       help=f'gin config (repeatable; default {default_gin}).')
  command.add_argument('--gin_bindings', action='append', default=[],
                       help="e.g. \"BertConfig.dtype = 'bfloat16'\".")


def parse_gin(args) -> None:
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


@contextlib.contextmanager
def one_or_many(command: str, single: str | None, path: str | None,
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


def check_top_k(top_k: int) -> None:
  if top_k < 1:
    raise errors.BadConfig(f'--top_k {top_k}: give 1 or more.')


def corpus_dir(args) -> str:
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  return args.corpus_dir or corpus.corpus_dir('wiki_leads')
