"""Imports flow one way (docs/architecture.md): shared utilities -> data ->
models -> index and training -> evaluation -> the command line. Every import
counts, including those inside functions."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'realm_jax'
# Top-level modules every layer may use; they import none of the layers.
SHARED = {'checksums', 'distributed', 'errors', 'extras', 'progress', 'embedded',
          'quiet', 'run_directory', 'run_guard', 'stage_plan'}
LAYERS = {'data': 1, 'models': 2, 'index': 3, 'training': 3,
          'evaluation': 4, 'released': 4, 'aot': 5, 'demo': 5,
          'world_demo': 5, 'repeats': 5, 'record': 5, 'main': 5}


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imports(path: pathlib.Path) -> set[str]:
  """Every realm_jax module `path` imports, by its dotted name."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      found.add(node.module)
      found.update(f'{node.module}.{alias.name}' for alias in node.names)
  return {name for name in found if name.startswith('realm_jax.')}


def _part(module: str) -> str:
  """The layer a dotted module name belongs to ('' for the package)."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


def _known(module: str) -> bool:
  """A module (not a name imported from one)."""
  relative = pathlib.Path(*module.split('.')[1:])
  return ((PACKAGE / relative).with_suffix('.py').is_file()
          or (PACKAGE / relative / '__init__.py').is_file())


MODULES = sorted(PACKAGE.rglob('*.py'))


def test_every_module_has_a_layer():
  for path in MODULES:
    part = _part(_module(path))
    assert part in LAYERS or part in SHARED or part == '', path


@pytest.mark.parametrize('path', MODULES, ids=lambda p: _module(p))
def test_imports_flow_one_way(path):
  importer = _module(path)
  here = _part(importer)
  wrong = []
  for imported in filter(_known, _imports(path)):
    there = _part(imported)
    if there == here or there == '':
      continue
    if here in SHARED or here == '':
      ok = there in SHARED
    elif there in SHARED:
      ok = True
    elif here == 'index' and there == 'training':
      ok = False  # The builder runs without the trainer's code.
    elif here == 'training' and imported == 'realm_jax.index.refresh':
      ok = False  # The trainer does not import the builder's loop.
    elif here in ('demo', 'aot') and there in ('main', 'demo'):
      ok = False  # The command line calls the demo, not the other way.
    elif here == 'world_demo' and there == 'main':
      ok = False  # It shares the demo's stages, and nothing of main.
    else:
      ok = LAYERS[there] <= LAYERS[here]
    if not ok:
      wrong.append(imported)
  assert not wrong, f'{importer} imports {wrong} against the layering'


def test_the_check_sees_imports_inside_functions(tmp_path):
  module = tmp_path / 'late.py'
  module.write_text('def f():\n  from realm_jax.index import refresh\n')
  assert 'realm_jax.index.refresh' in _imports(module)


def test_only_the_command_line_and_the_run_loader_touch_gins_global_state():
  allowed = {'realm_jax.main', 'realm_jax.training.run_loader'}
  touching = {_module(path) for path in MODULES
              if any(call in path.read_text()
                     for call in ('gin.clear_config', 'gin.query_parameter'))}
  assert touching <= allowed, touching - allowed


# The TensorFlow extra's side (realm_jax.extras): seqio's preprocessing,
# spaCy's annotation, the t5x adapter and the released checkpoints' import
# (it writes a corpus). Every other module is the core, which GPU and TPU
# machines run without the TF stack: the demo too, which builds its corpus
# only where no bundle brought one.
TF_SIDE = {'realm_jax.data.ict', 'realm_jax.data.masking',
           'realm_jax.data.salient_spans', 'realm_jax.data.vocabulary',
           'realm_jax.evaluation.qa_features',
           'realm_jax.evaluation.t5x_adapter', 'realm_jax.released.importer'}
CORE = [path for path in MODULES if _module(path) not in TF_SIDE]


def _module_level_imports(path: pathlib.Path) -> set[str]:
  """The top-level packages a module imports when it is imported: at module
  level, inside `try`, `if` and class bodies too, not inside functions."""
  found = set()
  pending = list(ast.parse(path.read_text()).body)
  while pending:
    node = pending.pop()
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.Lambda)):
      pending.extend(ast.iter_child_nodes(node))
    if isinstance(node, ast.Import):
      found.update(alias.name.split('.')[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.add(node.module.split('.')[0])
  return found


@pytest.mark.parametrize('path', CORE, ids=lambda p: _module(p))
def test_the_core_imports_no_tf_stack_at_module_level(path):
  from realm_jax import extras  # pylint: disable=g-import-not-at-top
  assert not _module_level_imports(path) & set(extras.TF_STACK), (
      f'{_module(path)} imports the TF stack; import it where it is needed, '
      'through realm_jax.extras.require')


def test_the_tf_side_is_what_it_says():
  assert TF_SIDE <= {_module(path) for path in MODULES}
