"""Every command the README and docs/usage.md show works as written, as far
as it can without the runs it reads: its flags exist and the required ones
are given, the gin files and presets it names are in the tree, and the
make targets the README names are the Makefile's."""

import pathlib
import re
import shlex

import pytest

from realm_jax import main
from realm_jax.cli import common
from realm_jax.experiments import preset as preset_lib
from tests.helpers import REPO as _REPO

pytestmark = pytest.mark.unit

REPO = pathlib.Path(_REPO)
PAGES = ('README.md', 'docs/usage.md')
SHELLS = ('', 'sh', 'shell', 'bash', 'console')


def _shell_blocks(text: str) -> list[str]:
  """The text of each fenced block in a shell language (or none)."""
  blocks, current, language = [], None, None
  for line in text.splitlines():
    if line.startswith('```'):
      if current is None:
        current, language = [], line[3:].strip()
      else:
        if language in SHELLS:
          blocks.append('\n'.join(current))
        current = None
    elif current is not None:
      current.append(line)
  return blocks


def commands(text: str) -> list[list[str]]:
  """The arguments after `realm-jax` on each line of the page's shell
  blocks (lines continued by a backslash joined, comments dropped); lines
  of output in the blocks name no program and are passed over."""
  found = []
  for block in _shell_blocks(text):
    for line in block.replace('\\\n', ' ').splitlines():
      try:
        words = shlex.split(line, comments=True)
      except ValueError:  # Output, such as a table row with a quote.
        continue
      program = next((i for i, w in enumerate(words)
                      if w.endswith('realm-jax')), None)
      if program is not None and (program == 0 or '=' in words[0]):
        found.append(words[program + 1:])
  return found


def _named(args: list[str], flag: str) -> list[str]:
  return [a.split('=', 1)[1] for a in args if a.startswith(f'--{flag}=')]


ALL = [(page, args) for page in PAGES
       for args in commands((REPO / page).read_text())]


def test_the_pages_show_commands():
  shown = {page: [a[0] for p, a in ALL if p == page] for page in PAGES}
  assert {'export', 'aot', 'fill'} <= set(shown['README.md'])
  assert {'train', 'refresh', 'eval', 'ask', 'import', 'corpus', 'data'} <= (
      set(shown['docs/usage.md']))


@pytest.mark.parametrize('page,args', ALL,
                         ids=[f'{p}:{" ".join(a)[:60]}' for p, a in ALL])
def test_a_shown_command_parses_as_written(page, args):
  parser = main._parser()  # pylint: disable=protected-access
  try:
    parsed = parser.parse_args(common.gin_flags(parser, args))
  except SystemExit as error:
    pytest.fail(f'{page}: `realm-jax {" ".join(args)}` is refused by the '
                f'command line (exit {error.code}).')
  for gin_file in _named(args, 'gin_file'):
    assert (REPO / gin_file).is_file(), f'{page}: no {gin_file}'
  preset = getattr(parsed, 'preset', None)
  if preset and not preset.endswith('.py'):
    assert preset in preset_lib.names(), f'{page}: no preset {preset}'


def test_the_make_targets_the_readme_names_are_the_makefiles():
  readme = (REPO / 'README.md').read_text()
  named = set(re.findall(r'`make ([a-z][a-z0-9-]*)', readme))
  named |= set(re.findall(r'^make ([a-z][a-z0-9-]*)', readme, re.M))
  targets = set(re.findall(r'^([a-z][a-z0-9-]*):', (REPO / 'Makefile')
                           .read_text(), re.M))
  assert {'demo', 'test', 'world'} <= named
  assert named <= targets, named - targets


def test_a_command_whose_flag_is_gone_is_refused(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text('```sh\n.venv/bin/realm-jax export --modeldir=runs/x '
                  '--output=e\nexport: done\n```\n')
  args, = commands(page.read_text())
  parser = main._parser()  # pylint: disable=protected-access
  with pytest.raises(SystemExit):
    parser.parse_args(common.gin_flags(parser, args))
  assert commands((REPO / "README.md").read_text())
