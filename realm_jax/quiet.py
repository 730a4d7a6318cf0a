"""The libraries' set-up chatter, hidden unless asked for.

A command shows its own progress lines, its results and the warnings a user
can act on. What the libraries print while they start is none of these, and
a newcomer reads an "E" line with "CUDA error" as the thing that broke:
TensorFlow's C++ log (CPU-feature and oneDNN notices; on a machine without
an NVIDIA driver, its failed CUDA probe), seqio's notices about the
project's own tasks (an uncached training task, sequence lengths, an
Evaluator without loggers) and Orbax's notices on the run directories that
commands open read-only.

Each library's own switch hides them: TensorFlow's C++ log level, an
environment variable it reads when it starts (set before it is imported,
and inherited by the processes a command starts), and a filter on absl's
logger, through which seqio and Orbax log, for those notices alone.
`--verbose`, or REALM_JAX_VERBOSE=1, shows everything again.
"""

import logging
import os

from etils import epath

VERBOSE_ENV = 'REALM_JAX_VERBOSE'
# TensorFlow's C++ log (XLA's too): 2 hides its INFO and WARNING lines, 3
# its ERROR lines as well. Errors that matter reach Python as exceptions.
TF_LOG_ENV = 'TF_CPP_MIN_LOG_LEVEL'
# Where an NVIDIA driver is loaded; without one, TensorFlow's CUDA probe can
# only fail, and says so as an ERROR line.
NVIDIA_DRIVER = '/proc/driver/nvidia/version'
# The beginnings of the notices hidden, all logged through absl: seqio's,
# then Orbax's.
NOTICES = ('Using an uncached FunctionDataset for training',
           'Given sequence lengths are longer than necessary',
           'Given sequence lengths *may be* insufficient',
           "'logger_cls' is empty so seqio.Evaluator will not log",
           'CheckpointManagerOptions.read_only=True, setting',
           'Given directory is read only=')


def verbose() -> bool:
  """Is everything shown ($REALM_JAX_VERBOSE set, to anything but 0)?"""
  return os.environ.get(VERBOSE_ENV, '0') not in ('', '0')


class _Notices(logging.Filter):
  """Drops the `NOTICES`; every other line passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(NOTICES)


def quiet(show_all: bool = False) -> None:
  """Hides the set-up chatter, unless `show_all` (--verbose) or
  $REALM_JAX_VERBOSE. Call it before TensorFlow is imported; a level the
  user set is kept. `show_all` is passed on to the processes started."""
  if show_all:
    os.environ[VERBOSE_ENV] = '1'
  if verbose():
    return
  os.environ.setdefault(
      TF_LOG_ENV, '2' if epath.Path(NVIDIA_DRIVER).exists() else '3')
  # absl's own logger: one of that name made here first would be a plain
  # logger, which absl would then use, naming itself as every line's caller.
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl = absl_logging.get_absl_logger()
  if not any(isinstance(f, _Notices) for f in absl.filters):
    absl.addFilter(_Notices())
