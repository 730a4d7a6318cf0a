"""Logging in a multi-process run: info lines from process 0 alone."""

import logging

import pytest

from realm_jax import distributed

pytestmark = pytest.mark.unit


@pytest.fixture
def stderr_log():
  """The command line's logging, removed again after the test (and the one
  an earlier test's command installed, put back)."""
  root = logging.getLogger()
  before = list(root.handlers)
  for handler in before:
    root.removeHandler(handler)
  distributed.log_to_stderr()
  distributed.log_to_stderr()  # Once per process, however often called.
  added = list(root.handlers)
  yield added
  for handler in added:
    root.removeHandler(handler)
  for handler in before:
    root.addHandler(handler)
  logging.getLogger('realm_jax').setLevel(logging.NOTSET)


def test_info_comes_from_process_zero_and_warnings_from_all(stderr_log,
                                                           monkeypatch):
  assert len(stderr_log) == 1
  handler = stderr_log[0]
  record = lambda level: logging.LogRecord('realm_jax.x', level, __file__, 1,
                                           'line', None, None)
  monkeypatch.setenv('JAX_PROCESS_ID', '0')
  assert handler.filter(record(logging.INFO))
  monkeypatch.setenv('JAX_PROCESS_ID', '1')
  assert not handler.filter(record(logging.INFO))
  assert handler.filter(record(logging.WARNING))
  assert logging.getLogger('realm_jax.index').isEnabledFor(logging.INFO)
