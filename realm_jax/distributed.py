"""Joining a multi-process JAX program (a Cloud TPU pod slice, or several
processes on one machine), before any device is touched.

The trainer and the index builder both call `initialize()` first. On Cloud
TPU VMs JAX finds the pod itself; elsewhere three variables name the group:
JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and
JAX_PROCESS_ID. A single process needs none of them.
"""

import logging
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

_VARIABLES = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')


def initialize() -> None:
  """`jax.distributed.initialize` once, when launched as several processes."""
  if jax.distributed.is_initialized():
    return
  if int(os.environ.get('JAX_NUM_PROCESSES', '1')) > 1:
    missing = [v for v in _VARIABLES if not os.environ.get(v)]
    if missing:
      raise ValueError(f'JAX_NUM_PROCESSES > 1 needs {", ".join(missing)} '
                       'too (the coordinator host:port and this process).')
    jax.distributed.initialize(os.environ['JAX_COORDINATOR_ADDRESS'],
                               int(os.environ['JAX_NUM_PROCESSES']),
                               int(os.environ['JAX_PROCESS_ID']))
  elif os.environ.get('TPU_WORKER_HOSTNAMES', '').count(',') > 0:
    jax.distributed.initialize()  # A multi-host TPU slice: JAX finds it.


def process_index() -> int:
  """This process' index, without starting JAX's backends before
  `initialize` (which must come first)."""
  if jax.distributed.is_initialized():
    return jax.process_index()
  return int(os.environ.get('JAX_PROCESS_ID', '0'))


class _CurrentStderr(logging.StreamHandler):
  """Writes to `sys.stderr` as it is when a line is logged, not as it was
  when the handler was made: a caller that redirects it (a notebook,
  `contextlib.redirect_stderr`, a test's capture) gets the lines."""

  def __init__(self):
    super().__init__(sys.stderr)

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, unused_value):
    pass


class _InfoOnProcessZero(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or process_index() == 0


def log_to_stderr() -> None:
  """realm-jax's info lines from process 0 alone, warnings from every
  process; other libraries' below warnings stay quiet. Once per process."""
  root = logging.getLogger()
  if any(isinstance(f, _InfoOnProcessZero) for h in root.handlers
         for f in h.filters):
    return
  handler = _CurrentStderr()
  handler.setFormatter(logging.Formatter('%(message)s'))
  handler.addFilter(_InfoOnProcessZero())
  root.addHandler(handler)
  logging.getLogger('realm_jax').setLevel(logging.INFO)


def agree(value: int) -> int:
  """Process 0's `value`, on every process (itself in a single process).

  Decisions read from the shared filesystem (is an index published? which
  checkpoint is newest?) can differ between processes that look a moment
  apart; what follows them is collective, so all must take process 0's.
  """
  if jax.process_count() == 1:
    return value
  return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


def everyone(flag: bool) -> bool:
  """True on every process when `flag` is True on every process: whether a
  collective step can go ahead (e.g. each process read its checkpoint)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.all(multihost_utils.process_allgather(np.int64(flag))))
