"""A preset as data: its stages in order, each with its kind, its run and
that run's gin bindings (steps and batches among them), and the comparisons
its report makes. One Python file a preset (`presets/<name>.py`, or any
file that defines `PRESET`), as big_vision writes its configs; `runner`
executes any of them, so a new preset is a new file, not new code.
"""

import dataclasses
import importlib.util
import os

from realm_jax import errors

PRESETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'presets')


@dataclasses.dataclass(frozen=True)
class Dir:
  """A run directory of the preset's work_dir, by its stage's `run_dir`:
  where one stage's run reads another's (a warm start)."""
  name: str


@dataclasses.dataclass(frozen=True)
class Stage:
  """One step of a preset, run once (a re-run skips it when finished).

  Attributes:
    name: its marker under work_dir/stages and its plan line.
    kind: what runs it (`runner.KINDS`: 'train', 'score', 'recall', ...).
    args: the kind's arguments: `run_dir`, the run directory it writes or
      reads (default `name`); for 'train', `run` (gin/runs/<run>.gin),
      `bindings` (gin parameter -> value, `Dir` for another stage's run)
      and `builder` (the index builder's cadence, run_refresh's bindings:
      given to the trainer, which records them for the builder beside it;
      None: no builder).
    result: where the results keep its record ('a/b' nests; default
      `name`; '' keeps none).
    needs_qa: skipped without the Open-QA benchmarks (recall, QA).
    timed: planned and timed (the machine's own measurement is not).
    memory: where training stages run side by side (`Preset.concurrent`),
      the share of the device's memory its processes may take (the index
      builder's included); None: what the runner's environment sets.
  """
  name: str
  kind: str
  args: dict = dataclasses.field(default_factory=dict)
  result: str | None = None
  needs_qa: bool = False
  timed: bool = True
  memory: float | None = None

  def writes(self) -> str | None:
    """The run directory it trains (a 'train' stage), else None."""
    return self.args.get('run_dir', self.name) if self.kind == 'train' else None

  def reads(self) -> set[str]:
    """The run directories it starts from or scores."""
    read = {value.name for value in self.args.get('bindings', {}).values()
            if isinstance(value, Dir)}
    if self.kind != 'train' and 'run_dir' in self.args:
      read.add(self.args['run_dir'])
    return read


@dataclasses.dataclass(frozen=True)
class Preset:
  """Everything one preset runs and reports.

  Attributes:
    family: whose report it writes and which corpus it makes: 'demo' (the
      Wikipedia leads) or 'world' (the controlled knowledge world).
    setup: the gin setup every run layers last.
    run_gin: gin files every run layers between its run file and `setup`.
    sizes: what the results record of it, and the plan scales by.
    stages: run in order.
    comparisons: (kind, *arguments) of each comparison the report makes,
      once every stage ran.
    prepared: its corpus and examples come from a bundle (`make
      bundle-gpu`): nothing is built, and no TensorFlow is needed.
    budget_minutes: for every stage, shared by `stage_plan.Plan`; None: no
      limit.
    concurrent: how many training stages may run at once, each in
      processes of its own sharing the device, as soon as the runs they
      start from are trained (`after`): their starts (compiling, restoring)
      overlap the others' steps. 1: every stage in this process, in order.
    memory: with `concurrent` above 1, the share of the device's memory the
      runner's own process may take (it scores beside the stages training);
      None: JAX's default.
  """
  family: str
  setup: str
  sizes: dict
  stages: tuple[Stage, ...]
  comparisons: tuple[tuple, ...] = ()
  run_gin: tuple[str, ...] = ()
  prepared: bool = False
  budget_minutes: float | None = None
  concurrent: int = 1
  memory: float | None = None

  def stage(self, name: str) -> Stage:
    return next(s for s in self.stages if s.name == name)


def after(stages, concurrent: int = 1) -> dict[str, list[str]]:
  """The stages each of `stages` waits for. One at a time (`concurrent`
  1): the one before it. Side by side: the stages that train the runs it
  reads, and the stages before the first training stage (the corpus, the
  machine's measurement), which everything follows."""
  names = [s.name for s in stages]
  if concurrent <= 1:
    return {name: names[i - 1:i] for i, name in enumerate(names)}
  first = next((i for i, s in enumerate(stages) if s.kind == 'train'),
               len(stages))
  writer = {}
  waits = {}
  for i, stage in enumerate(stages):
    waits[stage.name] = (names[:i] if i <= first else
                         [*names[:first], *(writer[run] for run in sorted(
                             stage.reads()) if run in writer)])
    if stage.writes():
      writer[stage.writes()] = stage.name
  return waits


def names() -> list[str]:
  """The presets that ship (presets/<name>.py)."""
  return sorted(f[:-3] for f in os.listdir(PRESETS_DIR)
                if f.endswith('.py') and not f.startswith('_'))


def load(name_or_file: str) -> Preset:
  """A shipped preset by name, or the preset a Python file defines as
  `PRESET`."""
  path = (name_or_file if name_or_file.endswith('.py')
          else os.path.join(PRESETS_DIR, f'{name_or_file}.py'))
  if path == name_or_file:
    errors.require_file(path, 'preset file')
  elif not os.path.isfile(path):
    raise errors.BadConfig(f'preset={name_or_file!r}: no such preset; '
                           f'expected one of {names()} or a .py file.')
  spec = importlib.util.spec_from_file_location(
      f'realm_jax_preset_{os.path.basename(path)[:-3]}', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as error:  # Its own, or a module's it imports.
    raise errors.BadInput(
        f'{error.filename}:{error.lineno}: {error.msg}.', 'A preset file is '
        'Python that defines PRESET: fix that line.') from error
  found = getattr(module, 'PRESET', None)
  if not isinstance(found, Preset):
    raise errors.BadConfig(f'{path} defines no PRESET (a '
                           'realm_jax.experiments.preset.Preset).')
  return found


def gin_bindings(bindings: dict, work_dir: str) -> list[str]:
  """`X = V` lines of gin, each `Dir` its path under `work_dir`."""
  out = []
  for name, value in bindings.items():
    if isinstance(value, Dir):
      value = os.path.join(work_dir, value.name)
    out.append(f'{name} = {value!r}')
  return out
