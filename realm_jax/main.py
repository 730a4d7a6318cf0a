"""The `realm-jax` command line: the program, its common flags, and the
dispatch to one module a command (`realm_jax.cli`)."""

import argparse
import functools
import logging
import os
import sys
import traceback

from realm_jax import errors
from realm_jax.cli import (aot, ask, common, corpus, data, demo, embed,
                           evaluate, export, fill, import_released, refresh,
                           search, train)

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


# Each command's module, in the order --help lists them.
MODULES = (demo, data, embed, train, fill, evaluate, ask, search, refresh, aot,
           import_released, export, corpus)
# The command's name -> its handler.
COMMANDS = {module.COMMAND: module.run for module in MODULES}
# What a command sets up before JAX is imported (`aot --target=gpu:...`
# puts JAX's CUDA plugin on the path, which JAX reads as it starts).
BEFORE_JAX = {module.COMMAND: module.before_jax for module in MODULES
              if hasattr(module, 'before_jax')}
# Commands that read and print, and leave nothing to write when they return.
READ_ONLY = ('ask', 'fill', 'search')


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
  for module in MODULES:
    module.add_parser(command, common)
  return parser


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


def main(argv=None, exit_at_once: bool = False) -> int:
  """Runs a command: 0 when it succeeds; a user error (`errors.UserError`)
  printed in a line or two, 2; a bug propagates with its traceback.

  `exit_at_once` (the `realm-jax` program): after a read-only command the
  process exits as soon as its output is flushed. Tearing the interpreter
  down (TensorFlow's and XLA's objects) takes about a second, a fifth of
  the time a question's answer takes.
  """
  parser = _parser()
  args = parser.parse_args(common.gin_flags(
      parser, sys.argv[1:] if argv is None else argv))
  try:
    if args.command in BEFORE_JAX:
      BEFORE_JAX[args.command](args)
  except errors.UserError as error:
    return _user_error(args, error)
  except PermissionError as error:
    return _user_error(args, errors.PermissionDenied.of(error))
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
    return _user_error(args, error)
  except PermissionError as error:
    return _user_error(args, errors.PermissionDenied.of(error))
  if exit_at_once and args.command in READ_ONLY:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)  # pylint: disable=protected-access
  return 0


def _user_error(args, error: errors.UserError) -> int:
  """A user error in a line (its traceback too with --debug); exit code 2."""
  if args.debug or os.environ.get(DEBUG_ENV, '0') not in ('', '0'):
    traceback.print_exc()
  print(f'realm-jax {args.command}: {errors.message(error)}', file=sys.stderr)
  return 2


def run() -> None:
  """The `realm-jax` program."""
  sys.exit(main(exit_at_once=True))


if __name__ == '__main__':
  run()
