"""What the commands share: their inputs given one at a time or as a file,
their gin flags, and the checks made before a model loads."""

import argparse
import contextlib
import itertools
import json
import os
import sys

import gin

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


def gin_flags(parser: argparse.ArgumentParser, argv):
  """`--gin.X=V` flags -> `--gin_bindings=X = V`, for a command of `parser`
  that takes gin bindings; another command's parser refuses them as they
  were typed, not as a flag the user never gave."""
  if not _takes_gin_bindings(parser, argv):
    return list(argv)
  out = []
  for arg in argv:
    if arg.startswith('--gin.') and '=' in arg:
      name, value = arg[len('--gin.'):].split('=', 1)
      out.append(f'--gin_bindings={name} = {value}')
    else:
      out.append(arg)
  return out


def _takes_gin_bindings(parser: argparse.ArgumentParser, argv) -> bool:
  """Whether the command (and subcommand) `argv` names has --gin_bindings."""
  # pylint: disable=protected-access
  for word in (arg for arg in argv if not arg.startswith('-')):
    choices = next((action.choices for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction)), {})
    if word not in choices:
      break
    parser = choices[word]
  return '--gin_bindings' in parser._option_string_actions


def add_gin(command, default_gin: str) -> None:
  """--gin_file and --gin_bindings, for a command that reads gin."""
  command.add_argument('--gin_file', action='append', default=None,
                       help=f'gin config (repeatable; default {default_gin}).')
  command.add_argument('--gin_bindings', action='append', default=[],
                       help="e.g. \"BertConfig.dtype = 'bfloat16'\".")


def parse_gin(args) -> None:
  """The command's gin files (default MiniLM's) and bindings, each refused
  by name if gin cannot take it (`run_loader.parse_gin`)."""
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  run_loader.parse_gin(args.gin_file or [
      os.path.join(run_loader.GIN_DIR, 'models', 'minilm_l6.gin')],
                       args.gin_bindings)


@contextlib.contextmanager
def one_or_many(command: str, single: str | None, path: str | None,
                 output_path: str | None):
  """(inputs [(file:line or None, text)], skip report, write(row)) of a
  command given one text or a file of them ('-': standard input); write
  prints nothing itself: it appends a JSONL row to `output_path`, if any,
  and flushes what was printed, so that piped output comes as it goes. An
  empty text, or an output file that cannot be written, is refused before
  any model loads; a file that leaves nothing written (blank, or every
  line skipped), once it is read."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from realm_jax.data.skips import SkipReport  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation.prediction import read_inputs  # pylint: disable=g-import-not-at-top
  report = SkipReport(f'{command} {path}')
  if path is None and not single.strip():
    raise errors.BadInput(f'Nothing to {command}: the text given is empty.')
  inputs = [(None, single)] if path is None else read_inputs(path, report)
  if path not in (None, '-'):
    # A file is read up to its first input now: one that holds none is
    # refused before the model loads (standard input is not waited for).
    first = next(inputs, None)
    if first is None:
      _nothing_to(command, path, report)
    inputs = itertools.chain([first], inputs)
  if output_path:
    check_output(output_path, '--output')
  written = 0
  with contextlib.ExitStack() as files:
    output = output_path and files.enter_context(
        epath.Path(output_path).open('w'))

    def write(row: dict) -> None:
      nonlocal written
      written += 1
      if output:
        output.write(json.dumps(row) + '\n')
        output.flush()
      sys.stdout.flush()

    yield inputs, report, write
  if not written:  # A file's every line skipped, or none.
    _nothing_to(command, path, report)
  if report:
    print(report.summary(), file=sys.stderr)


def _nothing_to(command: str, path: str, report) -> None:
  if report:
    print(report.summary(), file=sys.stderr)
  raise errors.BadInput(
      f'Nothing to {command} in {"<stdin>" if path == "-" else path}: ' + (
          'every line was skipped.' if report else 'it has no text.'),
      'Give one input a line.')


def check_top_k(top_k: int) -> None:
  if top_k < 1:
    raise errors.BadConfig(f'--top_k {top_k}: give 1 or more.')


def positive(kind=int):
  """An argparse type: a number of `kind` above 0, for counts and sizes
  (batch sizes, device counts, seconds, GiB). 0 or less is refused by the
  parser, naming the flag, before anything loads or is written: a batch of
  0 or a mesh of -2 would fail deep inside the work, or do none."""
  def parse(text: str):
    try:
      value = kind(text)
    except ValueError:
      value = None
    if value is None or not 0 < value < float('inf'):
      raise argparse.ArgumentTypeError(
          f'{text!r}: give a{" whole" if kind is int else ""} number above 0.')
    return value
  return parse


def flags_not_bound(configurable: str, flags: dict, whose: str) -> dict:
  """The `flags` given (None: not given), each a parameter of gin's
  `configurable` as well, for that call: refuses (BadConfig) one that a
  gin binding sets too, since gin lets an explicit argument win silently."""
  given = {name: value for name, value in flags.items() if value is not None}
  for name, value in given.items():
    try:
      bound = gin.query_parameter(f'{configurable}.{name}')
    except ValueError:  # Not bound.
      continue
    raise errors.BadConfig(
        f'--{name}={value} and the gin binding {configurable}.{name} = '
        f'{bound!r} both set {whose} {name}; give one.')
  return given


def check_output(path: str, flag: str) -> None:
  """Refuses (BadInput) an output file that cannot be written, before the
  model loads rather than after the work: a directory, or a file in a
  directory that is not there."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  target = epath.Path(path)
  if target.is_dir():
    problem = 'it is a directory'
  elif not target.parent.is_dir():
    problem = f'there is no directory {target.parent}'
  else:
    return
  raise errors.BadInput(f'Cannot write {flag} {path}: {problem}.',
                        'Give a file in a directory that exists.')


def check_output_dir(path: str, flag: str) -> None:
  """Refuses (BadInput) an output directory that cannot be made or written,
  before the model loads: one that is a file, or whose nearest existing
  ancestor is a file or (on this machine's disk) not writable."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  target = epath.Path(path)
  if target.exists() and not target.is_dir():
    raise errors.BadInput(f'Cannot write {flag} {path}: it is a file.',
                          'Give a directory.')
  existing = target if '://' in path else epath.Path(os.path.abspath(path))
  while not existing.exists() and existing.parent != existing:
    existing = existing.parent
  if not existing.is_dir():
    problem = f'{existing} is a file'
  elif '://' not in path and not os.access(existing, os.W_OK | os.X_OK):
    problem = f'{existing} is not writable'
  else:
    return
  raise errors.BadInput(f'Cannot write {flag} {path}: {problem}.',
                        'Give a directory that can be made there.')


def corpus_dir(args) -> str:
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  return args.corpus_dir or corpus.corpus_dir('wiki_leads')
