"""One runner for every preset (`preset.Preset`): each stage once, in its
order, planned against the preset's last record and timed; a finished
stage's marker makes a re-run skip it, and a training stage resumes from
its checkpoints.

A stage's kind is a function of the run's `Context` and the stage's args.
The kinds every family shares are here ('machine', 'train'); a family
module (`demo`, the Wikipedia leads) adds its own, starts the results, and
writes the report.
"""

from concurrent import futures
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import signal
import statistics
import threading
import time
from typing import Callable, NamedTuple

from etils import epath

from realm_jax import errors, launch_local, run_directory, stage_plan
from realm_jax.experiments import machine as machine_lib
from realm_jax.experiments import preset as preset_lib
from realm_jax.index import publication
from realm_jax.training import curves, run_loader

log = logging.getLogger(__name__)

# JAX's cap on the share of a GPU's memory one process takes.
MEMORY_FRACTION = 'XLA_PYTHON_CLIENT_MEM_FRACTION'
# Of a training stage's share of the device's memory (`Stage.memory`), what
# the index builder beside its trainer takes: it embeds in inference.
BUILDER_MEMORY = 0.04

DOCS_RESULTS = epath.Path(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))) / 'docs' / 'results'


class Stages:
  """Runs each stage once; a finished stage's marker makes re-runs skip it."""

  def __init__(self, work_dir: str):
    self.dir = epath.Path(work_dir) / 'stages'
    self.dir.mkdir(parents=True, exist_ok=True)

  def done(self, name: str) -> dict | None:
    path = self.dir / f'{name}.json'
    return json.loads(path.read_text()) if path.exists() else None

  def run(self, name: str, fn, *args) -> dict:
    finished = self.done(name)
    if finished is not None:
      log.info('== %s: done before (%.0fs), skipped', name,
               finished['seconds'])
      return finished
    log.info('== %s', name)
    start = time.perf_counter()
    result = fn(*args) or {}
    record = {'seconds': time.perf_counter() - start, **result}
    # Written whole, then renamed: a killed stage leaves no marker.
    (self.dir / f'{name}.json.tmp').write_text(json.dumps(record, indent=2))
    (self.dir / f'{name}.json.tmp').replace(self.dir / f'{name}.json')
    log.info('== %s: %.0fs', name, record['seconds'])
    return record


@dataclasses.dataclass
class Context:
  """What a stage's kind is handed: the preset, where its runs live, the
  stage's name, the run's seed, the results so far, the stage's share of
  the budget and the run's options (the world's `lockstep`). A stage run
  beside others (`background`) trains in processes of its own, with its
  share of the device's memory (`memory`), and stops when `cancel` is
  set."""
  preset: preset_lib.Preset
  work_dir: str
  stage: str
  seed: int
  results: dict
  time_limit_s: float | None = None
  options: dict = dataclasses.field(default_factory=dict)
  background: bool = False
  memory: float | None = None
  cancel: threading.Event | None = None

  def dir(self, name: str) -> str:
    return os.path.join(self.work_dir, name)


def train(ctx: Context, run: str, bindings: dict, run_dir: str | None = None,
          builder: dict | None = None, poll_seconds: float = 1,
          refresh_timeout: float = 600) -> dict:
  """`realm-jax train` of gin/runs/<run>.gin with the preset's gin files
  and `bindings` (the run's seed and its share of the budget added); with
  `builder` (the index builder's cadence, run_refresh's bindings), the
  builder beside it as a process of its own (`launch_local`), given the run
  directory and `poll_seconds` alone: the trainer is given the cadence and
  records it with its corpus and block length (run.json), where the builder
  reads them. Returns the step it reached and its step time, and with a
  builder how stale the indexes it read were. `run_dir`: under the
  work_dir (default: the stage's name). Beside other stages
  (`ctx.background`) the trainer is a process of its own too, its output
  in the run's train.log."""
  model_dir = ctx.dir(run_dir or ctx.stage)
  bindings = {**bindings, **(builder or {}), 'train.seed': ctx.seed}
  if ctx.time_limit_s is not None:
    bindings['train.time_limit_s'] = round(ctx.time_limit_s)
  lines = preset_lib.gin_bindings(bindings, ctx.work_dir)
  files = [f'gin/runs/{run}.gin', *ctx.preset.run_gin, ctx.preset.setup]
  train_args = [*(f'--gin_file={f}' for f in files),
                *(f'--gin_bindings={line}' for line in lines)]
  if builder is not None and ctx.memory is not None and (
      ctx.memory <= BUILDER_MEMORY):
    raise errors.BadConfig(
        f'stage {ctx.stage}: memory={ctx.memory} leaves its trainer nothing '
        f'beside its index builder\'s {BUILDER_MEMORY}.')
  share = (lambda f: () if ctx.memory is None
           else ((MEMORY_FRACTION, f'{f:.3f}'),))
  if builder is None:
    if not ctx.background:
      run_loader.configure(files, lines)
      run_loader.train(model_dir)
    else:
      launch_local.run_alone(launch_local.Job(
          f'{ctx.stage} trainer',
          launch_local.realm_jax_argv('train', model_dir, train_args),
          os.path.join(launch_local.log_dir(model_dir),
                       launch_local.TRAIN_LOG),
          share(ctx.memory)), ctx.cancel)
    return reached(model_dir)
  launch_local.run(
      model_dir, train_args=train_args,
      refresh_args=[f'--poll_seconds={poll_seconds}'],
      refresh_timeout=refresh_timeout, train_log=ctx.background,
      train_env=share((ctx.memory or 0) - BUILDER_MEMORY),
      refresh_env=share(BUILDER_MEMORY), cancel=ctx.cancel,
      label=ctx.stage if ctx.background else '')
  return {**freshness(model_dir), **reached(model_dir)}


def reached(model_dir: str) -> dict:
  """The step a training stage ended at (below its steps when its share
  of the budget ran out) and its median step time after the first (what
  the next run's plan expects, `stage_plan`)."""
  kept = run_directory.reload(run_directory.trainer_checkpoints(model_dir))
  _, seconds = curves.read_metrics(os.path.join(
      model_dir, 'train_metrics.jsonl')).get('step_seconds', ([], []))
  # The first logged row holds the first step, which compiles: a stage
  # stopped after a few steps would otherwise record the compile as its
  # step time.
  seconds = seconds[1:] if len(seconds) > 1 else []
  return {'steps_reached': kept[-1] if kept else 0,
          'step_seconds': statistics.median(seconds) if seconds else None}


def steps_beside(records: dict) -> dict:
  """For each training stage that ran beside others (its record has
  `began_s`, seconds from the run's start), how many stages were stepping
  at once, itself included, on average over its own steps (its last
  `steps_reached` x `step_seconds` seconds, as `stage_plan` splits a
  stage): its step time over that is what a step takes the device."""
  stepping = {}
  for name, r in records.items():
    if 'began_s' in r:
      steps_s = (r.get('steps_reached') or 0) * (r.get('step_seconds') or 0)
      end = r['began_s'] + r['seconds']
      stepping[name] = (end - min(steps_s, r['seconds']), end)
  beside = {}
  for name, (start, end) in stepping.items():
    cuts = sorted({start, end, *(t for span in stepping.values()
                                 for t in span if start < t < end)})
    weighted = sum((b - a) * sum(s <= a and b <= e
                                 for s, e in stepping.values())
                   for a, b in zip(cuts, cuts[1:]))
    beside[name] = weighted / (end - start) if end > start else 1.0
  return beside


def freshness(model_dir: str) -> dict:
  """How stale the indexes a run read were, and which it kept."""
  _, staleness = curves.read_metrics(os.path.join(
      model_dir, 'train_metrics.jsonl')).get('index_staleness', ([], []))
  return {'index_steps_kept': run_directory.reload(publication.index_manager(
      run_directory.index_dir(model_dir), read_only=True)),
          'mean_index_staleness': (sum(staleness) / len(staleness)
                                   if staleness else None),
          'max_index_staleness': max(staleness) if staleness else None}


KINDS = {'machine': lambda ctx: machine_lib.machine(), 'train': train}


def wall_seconds(results: dict) -> float:
  """A preset's wall time, the stages' sum where no run measured it
  (results written before; stages run side by side overlap)."""
  return results.get('wall_seconds') or sum(results['timings'].values())


def time_lines(results: dict) -> list[str]:
  """The report's table of seconds per stage, and the whole run's."""
  timings = results.get('timings', {})
  lines = ['| stage | seconds |', '|---|---|']
  lines += [f'| {k} | {v:.0f} |' for k, v in timings.items()]
  lines.append(f'| total | {sum(timings.values()):.0f} |')
  if results.get('wall_seconds'):
    lines.append(f'| wall time (stages side by side overlap) | '
                 f'{results["wall_seconds"]:.0f} |')
  return lines + ['']


class Family(NamedTuple):
  """What a family of presets (`Preset.family`, its name) adds to the
  runner: its stage kinds; whether its QA stages can run
  (`has_qa(preset)`); what it sets up and adds to the results before the
  first stage (`begin(preset, work_dir, options)`) and after the last
  (`finish(preset, work_dir, results, qa_ran)`: its comparisons); and its
  report (`report(results, work_dir, docs_dir)`)."""
  name: str
  kinds: dict
  has_qa: Callable
  begin: Callable
  finish: Callable
  report: Callable


class _Beside:
  """The stages running beside the runner's thread, up to `concurrent`,
  each in a thread of its own (whose processes train); `keep(stage,
  record)` is called in the runner's thread as each ends. One that fails
  stops the others (`cancel`) and raises."""

  def __init__(self, concurrent: int, keep: Callable):
    self.pool = futures.ThreadPoolExecutor(max(concurrent, 1))
    self.concurrent, self.keep = concurrent, keep
    self.running = {}  # future -> stage
    self.cancel = threading.Event()

  def free(self) -> bool:
    return len(self.running) < self.concurrent

  def start(self, stage: preset_lib.Stage, call: Callable) -> None:
    future = self.pool.submit(call)
    # A failure stops the others at once, not when the runner next looks.
    future.add_done_callback(
        lambda f: f.exception() is not None and self.cancel.set())
    self.running[future] = stage

  def wait(self, what: str, ready: Callable) -> None:
    """Keeps the records of the stages that ended until `ready()`."""
    block = False
    while True:
      ended, _ = futures.wait(list(self.running),
                              timeout=None if block else 0,
                              return_when=futures.FIRST_COMPLETED)
      for future in ended:
        stage = self.running.pop(future)
        if future.exception() is not None:
          self.close()
          raise future.exception()
        self.keep(stage, future.result())
      if ready():
        return
      if not self.running:
        raise RuntimeError(f'{what} waits for a stage that never ran')
      block = True

  def close(self) -> None:
    """Stops the stages still running and waits for them."""
    self.cancel.set()
    self.pool.shutdown(wait=True)


def _keep(results: dict, where: str, record: dict) -> None:
  *parents, last = where.split('/')
  for key in parents:
    results = results.setdefault(key, {})
  results[last] = record


def run(family: Family, work_dir: str, name: str,
        docs_dir: str | None = None, seed: int = 0, **options) -> dict:
  """Every stage of preset `name` (a shipped preset or a preset file) in
  order (with `Preset.concurrent`, training stages side by side once the
  runs they read are trained), each run's parameters, dropout and data
  order from `seed`, then the comparisons and the report (into `docs_dir`
  too, the record, when given). `family`: the kinds, comparisons and
  report the preset's family adds; `options` go to its `begin` and to
  every stage."""
  spec = preset_lib.load(name)
  if spec.family != family.name:
    raise errors.BadConfig(f'preset {name!r} is of the {spec.family!r} '
                           f'family, not {family.name!r}.')
  if epath.Path(work_dir).exists() and not epath.Path(work_dir).is_dir():
    raise errors.BadConfig(f'--work_dir {work_dir} is a file; a preset '
                           'writes its runs into a directory.')
  # This process trains too while launch_local's two jobs share the GPU.
  os.environ.setdefault(launch_local.PREALLOCATE, 'false')
  if spec.concurrent > 1 and spec.memory is not None:
    os.environ.setdefault(MEMORY_FRACTION, f'{spec.memory:.3f}')
  if '://' not in work_dir:
    work_dir = os.path.abspath(work_dir)  # Orbax wants absolute paths.
  kinds = {**KINDS, **family.kinds}
  unknown = sorted({s.kind for s in spec.stages} - set(kinds))
  if unknown:
    raise errors.BadConfig(f'preset {name!r}: no stage kind {unknown}; '
                           f'expected one of {sorted(kinds)}.')
  has_qa = family.has_qa(spec)
  stages = [s for s in spec.stages if has_qa or not s.needs_qa]
  results = {'preset': os.path.basename(name).removesuffix('.py'),
             'date': datetime.date.today().isoformat(),
             'sizes': spec.sizes, 'seed': seed,
             **family.begin(spec, work_dir, options)}
  timings = {}
  after = preset_lib.after(stages, spec.concurrent)
  background = {s.name for s in stages
                if spec.concurrent > 1 and s.kind == 'train'}
  timed = [s.name for s in stages if s.timed]
  plan = stage_plan.Plan(
      timed, spec.sizes, stage_plan.recorded(results['preset'], DOCS_RESULTS),
      spec.budget_minutes and 60 * spec.budget_minutes, after=after,
      background=background, concurrent=spec.concurrent,
      steps={s.name: s.args['bindings']['train.num_steps'] for s in stages
             if 'train.num_steps' in s.args.get('bindings', {})})
  print(f'realm-jax demo --preset={results["preset"]}: the plan\n'
        + '\n'.join(plan.lines()), flush=True)
  done = Stages(work_dir)
  began = time.monotonic()  # The plan's clock: stages' starts against it.
  stepped = {}  # Each background stage's record, for `steps_beside`.

  def keep(stage, record):
    if stage.name in background and stage.name in plan.started:
      record = {**record, 'began_s': plan.started[stage.name] - began}
      stepped[stage.name] = record
    if stage.timed:
      timings[stage.name] = record['seconds']
      plan.finish(stage.name)
    where = stage.name if stage.result is None else stage.result
    if where:
      _keep(results, where, record)

  beside = _Beside(spec.concurrent, keep)
  stack = contextlib.ExitStack()
  if background and threading.current_thread() is threading.main_thread():
    # A `kill` then stops the stages beside this process, not only it.
    stack.callback(signal.signal, signal.SIGTERM, signal.signal(
        signal.SIGTERM, launch_local.exit_on_sigterm))
  try:
    for stage in stages:
      beside.wait(stage.name, lambda s=stage: all(
          d in timings or done.done(d) for d in after[s.name]) and (
              s.name not in background or beside.free()))
      # A training stage's share of what is left of the budget.
      limit = (None if not stage.timed or done.done(stage.name)
               else plan.time_limit(stage.name))
      ctx = Context(spec, work_dir, stage.name, seed, results, limit,
                    options, background=stage.name in background,
                    memory=stage.memory if stage.name in background
                    else None, cancel=beside.cancel)
      if stage.timed and not done.done(stage.name):
        plan.start(stage.name)
      call = lambda s=stage, c=ctx: done.run(
          s.name, lambda: kinds[s.kind](c, **s.args))
      if stage.name in background:
        beside.start(stage, call)
      else:
        keep(stage, call())
    beside.wait('the end', lambda: not beside.running)
  finally:
    beside.close()
    stack.close()
  for name, count in steps_beside(stepped).items():
    if name in results:
      results[name]['steps_beside'] = count
  results.update(family.finish(spec, work_dir, results, has_qa))
  results['timings'] = timings
  if background:  # Stages overlapped: their sum is not the run's time.
    results['wall_seconds'] = time.monotonic() - began
  family.report(results, work_dir, docs_dir)
  return results
