"""Runs from gin: the run a launch configures, and a run loaded from disk.

gin's configuration is global; this module and the command line are the
only places that parse, clear or query it. Everything else receives what
they build: a `RunKind` (its objective and input preparer), a batch size, a
step count, the source of its examples (chosen here, once). A finished run is rebuilt from the operative config its trainer
saved (model_dir/config.gin), so `eval`, `ask`, `fill` and the t5x adapter
need nothing but the directory.
"""

import contextlib
import dataclasses
import logging
import os
import re
import tokenize

import gin
from etils import epath

from realm_jax import default_files, errors, run_directory, run_guard
from realm_jax.data import corpus, example_arrays, open_qa
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.input import configured as configured_input
from realm_jax.input.seqio_source import SeqioSource
from realm_jax.input.source import Source
from realm_jax.models.realm import model_retriever
from realm_jax.models.retriever import Retriever
from realm_jax.training import step_inputs, trainer
from realm_jax.training.run_kinds import RunKind

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'gin')
# The environment that changes what a run reads (its corpus, benchmarks,
# vocabulary and exported examples), recorded with it (`run_record`).
RECORDED_ENVIRONMENT = (corpus.CORPUS_ROOT_ENV, open_qa.DATA_DIR_ENV,
                        default_files.VOCAB_ENV, example_arrays.ROOT_ENV)
# The index builder's cadence, bound with the trainer's config and recorded
# with the run: the builder reads it there.
CADENCE = ('refresh_interval_steps', 'stale_factor')


def _not_a_path_probe(record: logging.LogRecord) -> bool:
  """False for the error gin logs (on the root logger) at each place it
  looked for a file without finding it: the BadConfig raised when no place
  has the file says so once, in one line."""
  return not record.getMessage().startswith('Path not found: ')


@contextlib.contextmanager
def _quiet_path_probes():
  root = logging.getLogger()
  root.addFilter(_not_a_path_probe)
  try:
    yield
  finally:
    root.removeFilter(_not_a_path_probe)


def parse_gin(files, bindings=(), finalize: bool = True) -> None:
  """Layers gin files, then bindings, over the current config. `include
  'gin/...'` and file paths resolve from the working directory or the
  repository root; a typo, a name no configurable has or a missing binding
  fails here, before work, naming the file or the binding (`BadConfig`).

  Each is parsed on its own, so that the one gin cannot take is named: gin's
  parser raises SyntaxError, TypeError, tokenize.TokenError, RecursionError,
  ImportError and more, most of them saying neither where nor what.
  """
  gin.add_config_file_search_path(os.path.dirname(GIN_DIR))
  with _quiet_path_probes():
    for file in files:
      try:
        gin.parse_config_file(file)
      except Exception as error:  # pylint: disable=broad-except
        message = _gin_message(error)
        raise errors.BadConfig(
            ('gin: ' if str(file) in message else f'gin file {file}: ') +
            message, 'Check the --gin_file paths (from here or the '
            'repository root) and the names bound in them.') from error
    for binding in bindings:
      try:
        gin.parse_config(binding)
      except Exception as error:  # pylint: disable=broad-except
        raise errors.BadConfig(
            f'gin binding {binding!r}: {_gin_message(error)}') from error
  if finalize:
    _finalize(bindings)
  else:  # Unlocked, gin would meet an undefined macro only when it is used.
    _check_macros(bindings)


def _check_macros(bindings) -> None:
  """Refuses a binding that uses a %MACRO nothing defines."""
  for binding in bindings:
    for name in _MACRO_USE.findall(_STRING.sub('', binding)):
      try:
        gin.query_parameter(f'%{name}')
      except ValueError as error:
        raise errors.BadConfig(
            f'gin binding {binding!r}: %{name} is not defined. Define it '
            f'({name} = ...) or give the value itself.') from error


def _gin_message(error: Exception) -> str:
  """What gin's parser found wrong, in a line."""
  if isinstance(error, tokenize.TokenError):  # Worded by each Python.
    return 'the text ends inside a bracket or a string left open.'
  if isinstance(error, UnicodeDecodeError):
    return f'not UTF-8 text (byte {error.start}: {error.reason}).'
  return errors.one_line(error)


_MACRO_USE = re.compile(r'%([A-Za-z_][\w./]*)')
_STRING = re.compile(r'\'[^\']*\'|"[^"]*"')
_UNDEFINED_MACRO = re.compile(r"No bindings specified for '(.+)/gin\.macro'")


def _finalize(bindings) -> None:
  """Locks the config; a %MACRO that nothing defines is refused by name,
  with the bindings that use it (gin's own message appends the whole
  config)."""
  try:
    gin.finalize()
  except ValueError as error:
    message = errors.one_line(error).split(' in config string:')[0]
    undefined = _UNDEFINED_MACRO.match(message)
    if not undefined:
      raise errors.BadConfig(
          (f'gin bindings {", ".join(map(repr, bindings))}: ' if bindings
           else 'gin: ') + message) from error
    macro = re.compile(re.escape(f'%{undefined[1]}') + r'(?![\w.])')
    users = ([repr(b) for b in bindings if macro.search(b)] or [
        line for line in gin.config_str().splitlines() if macro.search(line)])
    raise errors.BadConfig(
        f'gin: %{undefined[1]} is not defined' +
        (f' (used by {", ".join(users)})' if users else '') +
        f'. Define it ({undefined[1]} = ...) or give the value itself.'
    ) from error


def configure(files, bindings=()) -> None:
  """Replaces the whole gin config by `files` and `bindings` (one launch
  after another in one process, as the demo's stages are)."""
  gin.clear_config()
  parse_gin(files, bindings)


@dataclasses.dataclass(frozen=True)
class ConfiguredRun:
  """What `train` would train under the current gin config, and the source
  its examples come from."""
  run: RunKind
  batch_size: int
  num_steps: int
  seed: int
  source: Source

  @property
  def kind(self) -> str:
    return type(self.run).__name__

  def exporter(self) -> SeqioSource:
    """The seqio source, ready to write this run's splits as arrays
    (`SeqioSource.export`) whichever source the run reads."""
    return reading(self.run, SeqioSource())


def configured_run() -> ConfiguredRun:
  """The run kind (built now), batch size and step count bound for
  `trainer.train`, and the source its examples come from."""
  bound = gin.get_bindings(trainer.train)
  missing = [name for name in ('run', 'batch_size', 'num_steps')
             if name not in bound]
  if missing:
    raise errors.BadConfig('The gin config binds no ' + ', '.join(
        f'train.{name}' for name in missing) + '.')
  run = bound['run']
  check_vocabulary(run)
  return ConfiguredRun(run, bound['batch_size'], bound['num_steps'],
                       bound.get('seed', 0),
                       reading(run, configured_input.configured_source()))


def check_vocabulary(run: RunKind) -> None:
  """Refuses BERTs whose embedding table is smaller than the tasks'
  vocabulary: XLA clamps the id of a wordpiece past its end, silently."""
  tokenizer = step_inputs.task_tokenizer()
  size = tokenizer.vocab_size
  small = sorted({c.vocab_size for c in run.objective.bert_configs()
                  if c.vocab_size < size})
  if small:
    raise errors.BadConfig(
        f'BertConfig.vocab_size={small[0]}, but the tasks\' vocabulary '
        f'{tokenizer.vocab_path} has {size} wordpieces '
        f'(${default_files.VOCAB_ENV} '
        'names it; unset, BERT\'s uncased).')


def reading(run: RunKind, source: Source) -> Source:
  """`source`, made ready for the QA file a run names."""
  if getattr(run, 'qa_file', None):
    source.add_qa_file(run.qa_file, run.regex)
  return source


def _bound(name: str):
  """The value gin binds to `name` (a macro's value), None if unbound."""
  try:
    value = gin.query_parameter(name)
  except ValueError:  # Not bound, or run_refresh not imported at all.
    return None
  if isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()  # A macro: its value.
  return value


def run_record(run: RunKind) -> dict:
  """What the trainer of `run` records in its run directory
  (`run_directory.RECORD`) for the run's other readers: the index builder
  embeds the corpus and block cut recorded, at the cadence recorded, rather
  than a second configuration that may disagree."""
  directory = run_directory.absolute(corpus.corpus_dir(run.corpus_name))
  try:
    fingerprint = OpenCorpus(directory).fingerprint
  except errors.NotFound:  # Refused where the run reads it, if it does.
    fingerprint = None
  return {
      'kind': type(run).__name__,
      'corpus': {'name': run.corpus_name, 'dir': directory,
                 'fingerprint': fingerprint},
      'block_length': run.block_length,
      'refresh': {name: _bound(f'run_refresh.{name}') for name in CADENCE},
      'environment': {name: os.environ[name] for name in RECORDED_ENVIRONMENT
                      if name in os.environ}}


def train(model_dir: str):
  """Trains the configured run (`trainer.train`) from its source."""
  configured = configured_run()
  return trainer.train(model_dir, configured.source,
                       record=run_record(configured.run))


@dataclasses.dataclass(frozen=True)
class LoadedRun(ConfiguredRun):
  """A training run found on disk.

  Attributes:
    model_dir: its directory, absolute.
    config: the gin config it was rebuilt from (the saved operative config,
      then the files and bindings layered over it).
    step: its newest checkpoint (None: none saved yet).
    index_step: its newest published index (None: none).
  """
  model_dir: str
  config: str
  step: int | None
  index_step: int | None


def _steps(directory: str, manager) -> list[int]:
  """The steps in `directory` (none when it does not exist yet)."""
  if not epath.Path(directory).is_dir():
    return []
  return run_directory.reload(manager(directory))


def load_run(model_dir: str, gin_files=(), gin_bindings=()) -> LoadedRun:
  """The run in `model_dir`, rebuilt from its config.gin with `gin_files`
  and `gin_bindings` layered over it, checked as `train` checks them (the
  config.gin alone may name what is no longer there). gin keeps that
  config afterwards (the run's modules read it as they are built); it
  replaces whatever was configured before."""
  model_dir = run_directory.absolute(model_dir)
  config = run_directory.config_path(model_dir)
  if not config.exists():
    raise errors.NotFound(
        f'{model_dir} is not a realm-jax training run: it has no '
        f'{run_directory.CONFIG}.', 'Give the --model_dir of a run that '
        '`realm-jax train` wrote (or `realm-jax import` made).')
  run_guard.check_readable(model_dir)
  step_inputs.check_trained_vocabulary(model_dir)
  _parse_saved_config(config)
  parse_gin(gin_files, gin_bindings, finalize=False)
  configured = configured_run()
  checkpoints = _steps(run_directory.checkpoints_dir(model_dir), lambda _:
                       run_directory.trainer_checkpoints(model_dir))
  indexes = _steps(run_directory.index_dir(model_dir), lambda directory:
                   publication.index_manager(directory, read_only=True))
  return LoadedRun(
      run=configured.run, batch_size=configured.batch_size,
      num_steps=configured.num_steps, seed=configured.seed,
      source=configured.source,
      model_dir=model_dir,
      config=gin.config_str(), step=checkpoints[-1] if checkpoints else None,
      index_step=indexes[-1] if indexes else None)


def _parse_saved_config(config: epath.Path) -> None:
  """Replaces gin's config by a run's config.gin (`config`)."""
  data = config.read_bytes()  # Unreadable is not damaged: said apart.
  gin.clear_config()
  try:  # Tolerant: it may name what this command has not imported.
    gin.parse_config(data.decode('utf-8'), skip_unknown=True)
  except Exception as error:  # pylint: disable=broad-except
    raise errors.BadInput(
        f'{config} is damaged: {_gin_message(error)}', 'It is the config the '
        'run was trained with: put back a good copy, or train the run '
        'again.') from error


def run_retriever(model_dir: str, gin_bindings=()) -> Retriever:
  """The towers of the run in `model_dir` as its config.gin builds them,
  `gin_bindings` (the machine's settings) layered over it: what its index
  builder embeds with. Nothing else of the run is built or checked: the
  builder reads no examples and tokenizes nothing."""
  _parse_saved_config(run_directory.config_path(model_dir))
  parse_gin((), gin_bindings, finalize=False)
  return model_retriever()
