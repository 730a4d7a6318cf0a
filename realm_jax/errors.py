"""The errors a user causes and can fix, in one place.

The command line prints a `UserError` in a line or two (what is wrong, and
`hint`: what to do) and exits with code 2, without a traceback; anything
else is a bug and keeps its traceback (exit code 1). Each class also
derives from the built-in error it refines, so that `except ValueError`
and `except FileNotFoundError` still catch it.
"""

import re

from etils import epath


class UserError(Exception):
  """Bad input, a missing file, a config that cannot run: fixable by the
  user. `hint` says how."""

  def __init__(self, message: str, hint: str | None = None):
    super().__init__(message)
    self.hint = hint

  def __str__(self) -> str:
    message = super().__str__()
    return f'{message}\n{self.hint}' if self.hint else message


class NotFound(UserError, FileNotFoundError):
  """A file, directory, run, checkpoint, corpus or package that is not
  there."""


_OBJECT_REPR = re.compile(r'<[\w.]+ object at 0x[0-9a-fA-F]+>')


def one_line(error: BaseException) -> str:
  """Another library's message, its lines joined (gin's quote the line),
  without the reprs of its objects ('<ast.Name object at 0x7f...>'), which
  say nothing to a user."""
  text = ' '.join(line.strip() for line in str(error).splitlines()
                  if line.strip())
  return ' '.join(_OBJECT_REPR.sub('', text).split())


def message(error: UserError) -> str:
  """A user error's message and hint, without the lines gin appends to an
  error raised inside a configurable ("In call to configurable 'train'")."""
  return '\n'.join(line for line in str(error).splitlines()
                   if not line.startswith('  In call to configurable '))


def require_file(path, what: str) -> None:
  """Refuses (NotFound) a `path` that is not a file, naming it as `what`."""
  if not epath.Path(path).is_file():
    raise NotFound(f'No {what} {path}' + (
        ': it is a directory.' if epath.Path(path).is_dir() else '.'))


class PermissionDenied(UserError, PermissionError):
  """A file or directory this process may not read or write: the command
  line's word for a PermissionError from any library."""

  @classmethod
  def of(cls, error: PermissionError) -> 'PermissionDenied':
    where = error.filename or one_line(error)
    return cls(f'Permission denied: {where}.', 'Run as a user who may read '
               'and write it, or change its permissions.')


class BadInput(UserError, ValueError):
  """A file or text given to a command that it cannot use."""


class BadConfig(UserError, ValueError):
  """gin files, bindings or flags that cannot work together."""


class WrongRunKind(UserError, ValueError):
  """A run directory of a kind (Ict, Pretrain, Finetune) that the command
  does not serve."""


class IndexMismatchError(UserError, ValueError):
  """A published index that does not belong to this corpus or model."""


class DamagedStepError(UserError, RuntimeError):
  """A finished step that cannot be used: a file of it is missing,
  truncated or unreadable. `path` is the step, `file` the file."""

  def __init__(self, path, file, problem: str):
    super().__init__(f'Step {path} is damaged: {file}: {problem}. It is not '
                     'used.')
    self.path, self.file = str(path), str(file)


class ChecksumMismatch(UserError, RuntimeError):
  """A file whose bytes differ from the CRC-32C written with it, or that
  its directory's checksums.json lists but that is gone. `file`: it."""

  def __init__(self, file, problem: str):
    super().__init__(f'{file}: {problem}.')
    self.file, self.problem = str(file), problem


class TrainerRunning(UserError, RuntimeError):
  """Another process trains in this model_dir."""


class BuilderRunning(UserError, RuntimeError):
  """Another index builder publishes into this model_dir."""


class FormatMismatch(UserError, ValueError):
  """The run directory was written in another layout than this code's."""


class CheckpointMismatch(UserError, ValueError):
  """A whole step laid out otherwise than this code restores it: the code
  or the config changed since it was saved. The step itself is fine."""


class CheckpointSaveFailed(UserError, OSError):
  """A save the disk refused; `errno` is the OS's."""

  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.errno = code


class WeightImportError(UserError, ValueError):
  """A weights file that does not fit the configured BERT."""


class TensorFileError(UserError, ValueError):
  """A file, or a tensor in it, that the importer cannot read."""
