"""A preset's stages planned against its time budget.

A preset that must end within a machine's lease (the GPU preset: one
command of 9 minutes) plans before it starts: each stage's expected
seconds, from the preset's last recorded run (docs/results/<preset>.json)
scaled by its steps, and the total against the budget. As it goes, each
training stage may take its expected length and what the plan leaves of
the budget, or its share of what is left when the plan runs over
(`train.time_limit_s`, counted from the stage's start, compiling
included), and then ends with the steps it reached, checkpointed, so that
one stage running over does not eat the stages after it.
"""

import json
import time

from etils import epath

# Training stages and the preset size that counts their steps; a stage not
# in the record is expected to take what its kind took.
STEPS = {'ict': 'ict_steps', 'reader': 'reader_steps',
         'pretrain_': 'pretrain_steps'}
KINDS = ('pretrain_realm', 'masked_lm_realm', 'recall_ict')


def steps_of(stage: str, sizes: dict) -> int | None:
  """The steps `sizes` gives training stage `stage` (None: not one)."""
  for prefix, size in STEPS.items():
    if stage == prefix or prefix.endswith('_') and stage.startswith(prefix):
      return sizes.get(size)
  return None


class Plan:
  """Expected seconds per stage; `time_limit` shares the budget out.

  With `concurrent` above 1, the stages in `background` (training stages,
  each in processes of its own) start once the stages `after` names for
  them have finished, up to `concurrent` at once, while the others run one
  at a time in order; the plan expects the stages' steps to share the
  device (n stages stepping at once each step at 1/n of their speed) and
  their starts not to.
  """

  def __init__(self, stages: list[str], sizes: dict,
               record: dict | None = None, budget_s: float | None = None,
               after: dict[str, list[str]] | None = None,
               background=(), concurrent: int = 1,
               steps: dict[str, int] | None = None):
    self.stages, self.sizes, self.budget_s = stages, sizes, budget_s
    # `steps`: the stages that set their own (a run for no step, say).
    self.steps = {s: (steps or {}).get(s, steps_of(s, sizes))
                  for s in stages}
    machine = (record or {}).get('machine', {})
    self.source = record and (machine.get('device') or (
        f'{machine["cpu"]}, {machine.get("cores")} cores' if 'cpu' in machine
        else 'a machine it does not name'))
    # Each stage's (start, steps) seconds; None: nothing to expect.
    self.parts = {s: self._expect(s, record) for s in stages}
    self.expected = {s: None if p is None else sum(p)
                     for s, p in self.parts.items()}
    self.concurrent = concurrent
    self.background = set(background) if concurrent > 1 else set()
    if after is None or concurrent <= 1:
      after = {name: stages[i - 1:i] for i, name in enumerate(stages)}
    self.after = {s: [d for d in after.get(s, ()) if d in stages]
                  for s in stages}
    self.deadline = None if budget_s is None else time.monotonic() + budget_s
    self.finished = set()
    self.started = {}

  def _expect(self, stage: str, record: dict | None
              ) -> tuple[float, float] | None:
    """The recorded seconds of `stage` (or of its kind) at its steps now,
    as (start, steps): its start (compiling included) as it was and its
    steps at the recorded step time where the record has one; else the
    whole stage scaled by its steps, as its start (an upper bound: the
    start scales too). None without a record of either."""
    if not record:
      return None
    timings, then = record.get('timings', {}), record.get('sizes', {})
    seen = stage if stage in timings else next(
        (k for k in KINDS if k.split('_')[0] == stage.split('_')[0]
         and k in timings), None)
    if seen is None:
      return None
    # A stage cut by its budget share ran the steps it reached.
    steps = self.steps[stage]
    steps_then = (record.get(seen) or {}).get('steps_reached') or steps_of(
        seen, then)
    if not (steps and steps_then):
      return timings[seen], 0.0
    step_s = (record.get(seen) or {}).get('step_seconds') or (
        # Records before each stage kept its own: REALM's, measured apart.
        seen == 'pretrain_realm' and record.get('throughput', {}).get(
            'step_seconds'))
    if step_s:
      # A stage that stepped beside others took the device 1/n of the time.
      beside = (record.get(seen) or {}).get('steps_beside') or 1.0
      return (max(timings[seen] - steps_then * step_s, 0.0),
              steps * step_s / beside)
    return timings[seen] * steps / steps_then, 0.0

  def total(self) -> float | None:
    """The expected seconds of every stage, one after another."""
    known = [v for v in self.expected.values() if v is not None]
    return sum(known) if known else None

  def wall(self) -> float | None:
    """The expected seconds from the first stage's start to the last's
    end: the total, or with stages side by side their schedule's length."""
    if not self.background or self.total() is None:
      return self.total()
    return max((end for _, end in self._schedule().values()), default=0.0)

  def lines(self) -> list[str]:
    """The plan as a table, with the budget and the source of the times."""
    show = lambda v: '?' if v is None else f'{v:.0f}'
    lines = ['| stage | steps | expected s |', '|---|---|---|']
    lines += [f'| {s} | {"" if self.steps[s] is None else self.steps[s]} | '
              f'{show(self.expected[s])} |' for s in self.stages]
    total, wall = self.total(), self.wall()
    lines.append(f'| total | | {show(total)} |')
    if self.background:
      lines.append(f'| side by side (up to {self.concurrent} training '
                   'stages at once, their steps sharing the device) | | '
                   f'{show(wall)} |')
    source = (f'the recorded run on {self.source}: each stage\'s start as '
              'it took, its steps at the recorded step time (else the whole '
              'stage scaled by its steps)' if self.source else
              'no recorded run: nothing to expect')
    lines.append(f'Expected times: {source}.')
    if self.budget_s is not None:
      over = wall is not None and wall > self.budget_s
      lines.append(
          f'Budget: {self.budget_s:.0f} s; '
          + ('over it: each training stage stops at its share and keeps '
             'the steps it reached.' if over else
             'each training stage may take its expected time and what the '
             'plan leaves of the budget.'))
    return lines

  def _schedule(self) -> dict[str, tuple[float, float]]:
    """When each unfinished stage is expected to start and end, in seconds
    from now: each waits for the stages `after` names and, in the
    background, for one of `concurrent` places; one not in the background
    runs alone, and nothing starts while it runs (the runner's one thread
    runs it); stages stepping at once share the device. A stage with
    nothing to expect counts as the mean of the others. A stage started
    already has its elapsed seconds taken off, from its start first."""
    now = time.monotonic()
    pending = [s for s in self.stages if s not in self.finished]
    known = [self.expected[s] for s in pending if self.expected[s]]
    mean = sum(known) / len(known) if known else 1.0
    left = {}
    for s in pending:
      start, steps = self.parts[s] or (mean, 0.0)
      spent = now - self.started.get(s, now)
      left[s] = [max(start - spent, 0.0),
                 max(steps - max(spent - start, 0.0), 0.0)]
    clock, begun, ended = 0.0, {}, {}
    running = [s for s in pending if s in self.started]
    for s in running:
      begun[s] = 0.0
    queue = [s for s in pending if s not in self.started]
    while queue or running:
      while queue and all(d in ended or d in self.finished
                          for d in self.after[queue[0]]):
        head = queue[0]
        # The runner starts stages from one thread, which a stage not in
        # the background holds while it runs.
        place = all(s in self.background for s in running) and (
            head not in self.background or len(running) < self.concurrent)
        if not place:
          break
        running.append(queue.pop(0))
        begun[head] = clock
      if not running:
        break  # Waits for a stage not planned: nothing more to expect.
      stepping = sum(1 for s in running if not left[s][0] and left[s][1])
      step = min(left[s][0] or left[s][1] * stepping for s in running)
      clock += step
      for s in running:
        if left[s][0]:
          left[s][0] = max(left[s][0] - step, 0.0)
        elif left[s][1]:
          left[s][1] = max(left[s][1] - step / stepping, 0.0)
      for s in [s for s in running if left[s] == [0.0, 0.0]]:
        running.remove(s)
        ended[s] = clock
    return {s: (begun[s], ended[s]) for s in ended}

  def time_limit(self, stage: str) -> float | None:
    """Seconds `stage` may take now: its expected length in the schedule
    of the stages still to run (`_schedule`) and whatever that schedule
    leaves of the budget; when it would run over, its share of what is
    left by that length. None without a budget."""
    if self.deadline is None:
      return None
    left = max(self.deadline - time.monotonic(), 0.0)
    schedule = self._schedule()
    wall = max((end for _, end in schedule.values()), default=0.0)
    if stage not in schedule:
      return left
    begin, end = schedule[stage]
    if wall <= left:
      return end - begin + left - wall
    return left * (end - begin) / wall

  def start(self, stage: str) -> None:
    self.started[stage] = time.monotonic()

  def finish(self, stage: str) -> None:
    self.finished.add(stage)


def recorded(preset: str, docs_dir: epath.Path) -> dict | None:
  """The newest measure of the preset's stages, by its 'date' (a record
  without one is the oldest): its last recorded run (docs/results/
  <preset>.json), or a run cut short to time its stages
  (<preset>_stage_times*.json, of the same form). A record of several
  runs (`--repeats`) is planned from its first, the date its own."""
  found = []
  for path in [docs_dir / f'{preset}.json',
               *sorted(docs_dir.glob(f'{preset}_stage_times*.json'))]:
    try:
      record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
      continue
    if record.get('runs'):
      record = {**record['runs'][0], 'date': record.get(
          'date', record['runs'][0].get('date', ''))}
    found.append(record)
  return max(found, key=lambda record: record.get('date', ''), default=None)
