"""The libraries' set-up chatter is hidden by default, by each library's own
switch, and shown with --verbose or $REALM_JAX_VERBOSE (a command's own
stderr, by default and verbose, is checked in test_main)."""

import logging
import os

import pytest

from realm_jax import launch_local
from realm_jax import main, quiet

pytestmark = pytest.mark.unit


@pytest.fixture
def fresh_env(monkeypatch):
  """Neither variable set, and both as they were after the test (set
  first, so that what `quiet` sets is undone too)."""
  for name in (quiet.VERBOSE_ENV, quiet.TF_LOG_ENV):
    monkeypatch.setenv(name, '')
    monkeypatch.delenv(name)
  return monkeypatch


def _passes(message: str, *args) -> bool:
  """Does a line logged on absl's logger reach the handlers?"""
  return logging.getLogger('absl').filter(logging.LogRecord(
      'absl', logging.WARNING, __file__, 1, message, args, None))


def test_by_default_the_notices_are_dropped_and_warnings_pass(fresh_env):
  quiet.quiet()
  assert os.environ[quiet.TF_LOG_ENV] in ('2', '3')
  assert not _passes('Given directory is read only=%s', '/run/checkpoints')
  assert not _passes('CheckpointManagerOptions.read_only=True, setting '
                     'save_interval_steps=0.')
  assert not _passes("'logger_cls' is empty so seqio.Evaluator will not log "
                     'its results.')
  assert not _passes('Given sequence lengths *may be* insufficient for some '
                     'evaluation inputs')
  assert _passes('Checkpoint at step %d is corrupt; skipping it.', 3)
  assert _passes('Given directory does not exist')


@pytest.mark.parametrize('how', ['flag', 'environment'])
def test_verbose_leaves_every_switch_as_the_libraries_set_it(fresh_env, how):
  if how == 'environment':
    fresh_env.setenv(quiet.VERBOSE_ENV, '1')
  quiet.quiet(show_all=how == 'flag')
  assert quiet.TF_LOG_ENV not in os.environ
  assert os.environ[quiet.VERBOSE_ENV] == '1'  # The jobs it starts too.


def test_a_level_the_user_set_is_kept(fresh_env):
  fresh_env.setenv(quiet.TF_LOG_ENV, '0')
  quiet.quiet()
  assert os.environ[quiet.TF_LOG_ENV] == '0'


@pytest.mark.parametrize('argv,verbose', [
    (['demo'], False), (['--verbose', 'demo'], True),
    (['demo', '--verbose'], True),
    (['eval', '--model_dir=x', '--task=nq_open', '--verbose'], True)])
def test_verbose_is_a_flag_of_every_command(argv, verbose):
  assert main._parser().parse_args(argv).verbose == verbose


def test_the_launcher_passes_verbose_on_to_its_jobs(fresh_env, monkeypatch):
  monkeypatch.setattr(launch_local, 'run', lambda *args, **kwargs: None)
  assert launch_local.main(
      ['--model_dir=x', '--gin_file=a.gin', '--verbose']) == 0
  assert os.environ[quiet.VERBOSE_ENV] == '1'
