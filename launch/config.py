"""The pod launch config (TOML), validated before any command is built.

The dataclasses below are the schema: a field without a default is a required
key, a field with one is optional. A missing, unknown or mistyped key fails
naming the file and the key, so a typo never reaches gcloud.
"""

import dataclasses
import difflib
import re
import tomllib

PROVISIONING = ('standard', 'spot', 'preemptible')
# What the shipped config leaves for the user to fill in.
PLACEHOLDER = 'YOUR_'


class ConfigError(ValueError):
  """A config problem, worded for the person editing the file."""


@dataclasses.dataclass(frozen=True)
class Install:
  """[install]: a checkout of `repo` at `ref` on every worker (the jobs read
  gin files from its gin/ directory, which the package does not ship), a venv
  with jax[tpu]==`jax_version`, and `pip_install` (each entry: the arguments
  of one more `pip install`)."""
  repo: str
  ref: str
  jax_version: str
  python: str = 'python3.11'
  pip_install: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Slice:
  """[trainer] / [builder]: one TPU slice and the job it runs."""
  name: str
  accelerator_type: str
  runtime_version: str
  gin_files: tuple[str, ...]
  provisioning: str = 'standard'
  gin_bindings: tuple[str, ...] = ()
  flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Config:
  """Top level: where the slices live and the storage both jobs share."""
  project: str
  zone: str
  model_dir: str
  corpus_dir: str
  install: Install
  trainer: Slice
  builder: Slice
  env: dict[str, str] = dataclasses.field(default_factory=dict)

  def slices(self) -> tuple[tuple[str, Slice], ...]:
    return ('trainer', self.trainer), ('builder', self.builder)


def load(path: str) -> Config:
  """Reads and validates `path`; raises ConfigError naming file and key."""
  try:
    with open(path, 'rb') as f:
      table = tomllib.load(f)
  except FileNotFoundError:
    raise ConfigError(f'{path}: no such file') from None
  except OSError as error:  # A directory, say.
    raise ConfigError(f'{path}: cannot be read ({error.strerror})') from None
  except UnicodeDecodeError as error:  # tomllib decodes the whole file first.
    raise ConfigError(f'{path}: not UTF-8 ({error})') from None
  except tomllib.TOMLDecodeError as error:
    raise ConfigError(f'{path}: not valid TOML ({error})') from None
  except RecursionError:  # tomllib recurses into nested arrays and tables.
    raise ConfigError(f'{path}: not valid TOML (nested too deeply)') from None
  config = _read(table, Config, '', path)
  _check(config, path)
  return config


def placeholders(config: Config) -> list[str]:
  """The keys still holding a YOUR_... placeholder of the shipped config."""
  found = []

  def visit(value, key):
    if isinstance(value, dict):
      for name, item in value.items():
        visit(item, f'{key}.{name}' if key else name)
    elif isinstance(value, (list, tuple)):
      for item in value:
        visit(item, key)
    elif isinstance(value, str) and PLACEHOLDER in value and key not in found:
      found.append(key)

  visit(dataclasses.asdict(config), '')
  return found


def _read(table: dict, cls, where: str, path: str):
  """`table` as a `cls`, every key checked against the dataclass fields;
  `where` is the section ('[trainer]'), empty at the top level."""
  prefix = f'{path}: {where} ' if where else f'{path}: '
  fields = {f.name: f for f in dataclasses.fields(cls)}
  for key in table:
    if key not in fields:
      close = difflib.get_close_matches(key, fields, n=1)
      hint = (f"; did you mean '{close[0]}'?" if close else
              f" (known: {', '.join(fields)})")
      raise ConfigError(f"{prefix}unknown key '{key}'{hint}")
  values = {}
  for name, field in fields.items():
    section = dataclasses.is_dataclass(field.type)
    if name in table:
      value = _value(table[name], field.type, f"{prefix}'{name}'")
      if section:
        value = _read(value, field.type, f'[{name}]', path)
      values[name] = value
    elif (field.default is dataclasses.MISSING and
          field.default_factory is dataclasses.MISSING):
      raise ConfigError(f'{path}: missing section [{name}]' if section else
                        f"{prefix}missing '{name}'")
  return cls(**values)


def _value(value, kind, what: str):
  """`value` checked against a field's type: str, tuple[str, ...] (a TOML
  list), dict[str, str] or a dataclass (a TOML table)."""
  if kind is str:
    ok, expected = isinstance(value, str), 'a string'
  elif kind == tuple[str, ...]:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    expected, value = 'a list of strings', tuple(value) if ok else value
  elif kind == dict[str, str]:
    ok = isinstance(value, dict) and all(isinstance(v, str)
                                         for v in value.values())
    expected = 'a table of strings'
  else:
    ok, expected = isinstance(value, dict), 'a table'
  if not ok:
    raise ConfigError(f'{what} must be {expected}, got {value!r}')
  return value


def _check(config: Config, path: str) -> None:
  """What the types alone do not say."""
  for key in ('model_dir', 'corpus_dir'):
    if not getattr(config, key).startswith('gs://'):
      raise ConfigError(f"{path}: '{key}' must be a gs:// path that every "
                        f'worker of both slices reaches, got '
                        f'{getattr(config, key)!r}')
  for role, slice_ in config.slices():
    if slice_.provisioning not in PROVISIONING:
      raise ConfigError(f"{path}: [{role}] 'provisioning' must be one of "
                        f'{", ".join(PROVISIONING)}, got '
                        f'{slice_.provisioning!r}')
  if config.trainer.name == config.builder.name:
    raise ConfigError(f"{path}: [trainer] and [builder] share the 'name' "
                      f'{config.trainer.name!r}; each job needs its own slice')
  for name in config.env:
    if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name):
      raise ConfigError(f"{path}: [env] '{name}' is not an environment "
                        'variable name')
