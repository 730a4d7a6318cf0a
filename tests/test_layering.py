"""Imports flow one way across the whole tree (docs/architecture.md): shared
utilities -> data -> models and the input layer -> index and training ->
evaluation -> the experiments -> the commands -> the command line ->
launch/ -> benchmarks/. Every import counts, including those inside functions."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / 'realm_jax'
# The tree's packages: the library, and what runs from a checkout above it.
TREE = ('realm_jax', 'launch', 'benchmarks')
# Top-level modules every layer may use; they import none of the layers.
SHARED = {'checksums', 'default_files', 'distributed', 'errors', 'extras',
          'gpu_compiler', 'progress', 'quiet', 'run_directory', 'run_guard',
          'stage_plan'}
LAYERS = {'data': 1, 'models': 2, 'input': 2, 'index': 3, 'training': 3,
          'evaluation': 4, 'released': 4, 'launch_local': 4, 'aot': 5,
          'export': 5,
          'experiments': 5, 'repeats': 5, 'record': 5, 'cli': 6, 'main': 7,
          'launch': 8, 'benchmarks': 9}


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imports(path: pathlib.Path) -> set[str]:
  """Every module of the tree `path` imports, by its dotted name."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = {f'{node.module}.{alias.name}' for alias in node.names}
      found.update(names)
      if not all(map(_known, names)):  # Not modules alone: the package too.
        found.add(node.module)
  return {name for name in found if name.split('.')[0] in TREE}


def _part(module: str) -> str:
  """The layer a dotted module name belongs to ('' for the library's face):
  launch/ and benchmarks/ are each one."""
  parts = module.split('.')
  if parts[0] != 'realm_jax':
    return parts[0]
  return parts[1] if len(parts) > 1 else ''


def _known(module: str) -> bool:
  """A module (not a name imported from one)."""
  relative = pathlib.Path(*module.split('.'))
  return ((REPO / relative).with_suffix('.py').is_file()
          or (REPO / relative / '__init__.py').is_file())


MODULES = sorted(path for package in TREE
                 for path in (REPO / package).rglob('*.py'))
LIBRARY = [path for path in MODULES if path.is_relative_to(PACKAGE)]


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
    elif here in ('experiments', 'aot') and there in ('main', 'record'):
      ok = False  # The command line calls the presets, not the other way.
    elif here == 'input' and there == 'models':
      ok = False  # Examples are made without the model's code.
    else:
      ok = LAYERS[there] <= LAYERS[here]
    if not ok:
      wrong.append(imported)
  assert not wrong, f'{importer} imports {wrong} against the layering'


def test_the_check_sees_imports_inside_functions(tmp_path):
  module = tmp_path / 'late.py'
  module.write_text('def f():\n  from realm_jax.index import refresh\n'
                    '  import launch.pod\n')
  assert {'realm_jax.index.refresh', 'launch.pod'} <= _imports(module)


def test_no_two_modules_import_each_other_even_through_others():
  graph = {_module(path): {name for name in _imports(path) if _known(name)}
           for path in MODULES}
  graph = {module: {name for name in names if name != module}
           for module, names in graph.items()}

  def reaches(start, goal):
    seen, pending = set(), list(graph.get(start, ()))
    while pending:
      module = pending.pop()
      if module == goal:
        return True
      if module not in seen:
        seen.add(module)
        pending.extend(graph.get(module, ()))
    return False

  circles = sorted(module for module in graph if reaches(module, module))
  assert not circles, f'modules on a circle of imports: {circles}'


def test_only_the_input_layer_names_the_source_kinds():
  """Everything else is handed a `Source`: no branch on 'seqio' or
  'arrays' outside realm_jax/input/."""
  branching = [
      _module(path) for path in LIBRARY
      if not path.is_relative_to(PACKAGE / 'input') and any(
          phrase in path.read_text() for phrase in (
              ".source == '", "kind == 'seqio'", "kind == 'arrays'",
              'Examples()'))]
  assert not branching, branching


def test_only_the_command_line_and_the_run_loader_touch_gins_global_state():
  allowed = {'realm_jax.cli.common', 'realm_jax.training.run_loader'}
  touching = {_module(path) for path in LIBRARY
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
           'realm_jax.input.qa_features', 'realm_jax.input.tasks',
           'realm_jax.input.tasks.common', 'realm_jax.input.tasks.ict',
           'realm_jax.input.tasks.open_qa', 'realm_jax.input.tasks.pretraining',
           'realm_jax.evaluation.t5x_adapter', 'realm_jax.released.importer'}
CORE = [path for path in LIBRARY if _module(path) not in TF_SIDE]


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
  assert TF_SIDE <= {_module(path) for path in LIBRARY}
