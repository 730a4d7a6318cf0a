"""A preset's stages planned against its time budget.

A preset that must end within a machine's lease (the GPU preset: one
command of 9 minutes) plans before it starts: each stage's expected
seconds, from the preset's last recorded run (docs/results/<preset>.json)
scaled by its steps, and the total against the budget. As it goes, each
training stage may take its share of what is left (`train.time_limit_s`,
counted from the stage's start, compiling included) and then ends with the
steps it reached, checkpointed, so that one stage running over does not eat
the stages after it.
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
  """Expected seconds per stage; `time_limit` shares the budget out."""

  def __init__(self, stages: list[str], sizes: dict,
               record: dict | None = None, budget_s: float | None = None):
    self.stages, self.sizes, self.budget_s = stages, sizes, budget_s
    machine = (record or {}).get('machine', {})
    self.source = record and (machine.get('device') or (
        f'{machine["cpu"]}, {machine.get("cores")} cores' if 'cpu' in machine
        else 'a machine it does not name'))
    self.expected = {s: self._expect(s, record) for s in stages}
    self.deadline = None if budget_s is None else time.monotonic() + budget_s
    self.finished = set()

  def _expect(self, stage: str, record: dict | None) -> float | None:
    """The recorded seconds of `stage` (or of its kind) at its steps now:
    its start (compiling included) as it was and its steps at the recorded
    step time where the record has one; else scaled whole by its steps (an
    upper bound: the start scales too). None without a record of either."""
    if not record:
      return None
    timings, then = record.get('timings', {}), record.get('sizes', {})
    seen = stage if stage in timings else next(
        (k for k in KINDS if k.split('_')[0] == stage.split('_')[0]
         and k in timings), None)
    if seen is None:
      return None
    # A stage cut by its budget share ran the steps it reached.
    steps = steps_of(stage, self.sizes)
    steps_then = (record.get(seen) or {}).get('steps_reached') or steps_of(
        seen, then)
    if not (steps and steps_then):
      return timings[seen]
    step_s = (record.get(seen) or {}).get('step_seconds') or (
        # Records before each stage kept its own: REALM's, measured apart.
        seen == 'pretrain_realm' and record.get('throughput', {}).get(
            'step_seconds'))
    if step_s:
      return max(timings[seen] - steps_then * step_s, 0.0) + steps * step_s
    return timings[seen] * steps / steps_then

  def total(self) -> float | None:
    known = [v for v in self.expected.values() if v is not None]
    return sum(known) if known else None

  def lines(self) -> list[str]:
    """The plan as a table, with the budget and the source of the times."""
    show = lambda v: '?' if v is None else f'{v:.0f}'
    lines = ['| stage | steps | expected s |', '|---|---|---|']
    lines += [f'| {s} | {steps_of(s, self.sizes) or ""} | '
              f'{show(self.expected[s])} |' for s in self.stages]
    total = self.total()
    lines.append(f'| total | | {show(total)} |')
    source = (f'the recorded run on {self.source}: each stage\'s start as '
              'it took, its steps at the recorded step time (else the whole '
              'stage scaled by its steps)' if self.source else
              'no recorded run: nothing to expect')
    lines.append(f'Expected times: {source}.')
    if self.budget_s is not None:
      over = total is not None and total > self.budget_s
      lines.append(
          f'Budget: {self.budget_s:.0f} s; '
          + ('over it: each training stage stops at its share and keeps '
             'the steps it reached.' if over else
             'each training stage may take its share of what is left.'))
    return lines

  def time_limit(self, stage: str) -> float | None:
    """Seconds `stage` may take now: what is left of the budget, shared
    among it and the stages after it by their expected times (stages with
    nothing to expect count as the mean of the others); None without a
    budget."""
    if self.deadline is None:
      return None
    ahead = [s for s in self.stages[self.stages.index(stage):]
             if s not in self.finished]
    known = [self.expected[s] for s in ahead if self.expected[s]]
    mean = sum(known) / len(known) if known else 1.0
    weight = lambda s: self.expected[s] or mean
    left = max(self.deadline - time.monotonic(), 0.0)
    return left * weight(stage) / sum(weight(s) for s in ahead)

  def finish(self, stage: str) -> None:
    self.finished.add(stage)


def recorded(preset: str, docs_dir: epath.Path) -> dict | None:
  """The newest measure of the preset's stages, by its 'date' (a record
  without one is the oldest): its last recorded run (docs/results/
  <preset>.json), or a run cut short to time its stages
  (<preset>_stage_times*.json, of the same form)."""
  found = []
  for path in [docs_dir / f'{preset}.json',
               *sorted(docs_dir.glob(f'{preset}_stage_times*.json'))]:
    try:
      found.append(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
      continue
  return max(found, key=lambda record: record.get('date', ''), default=None)
