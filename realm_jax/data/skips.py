"""Counting what a long job skipped and why, reported once at its end."""

import collections
import json


class SkipReport:
  """Counts skipped or repaired inputs by reason, keeping a few locations each.

  Jobs call `add(reason, where)` instead of crashing or dropping silently, and
  print `summary()` when they finish.
  """

  def __init__(self, job: str, examples_per_reason: int = 3):
    self.job = job
    self.counts: collections.Counter = collections.Counter()
    self.examples: dict[str, list[str]] = collections.defaultdict(list)
    self._keep = examples_per_reason

  def add(self, reason: str, where: str = '') -> None:
    self.counts[reason] += 1
    if where and len(self.examples[reason]) < self._keep:
      self.examples[reason].append(where)

  def __bool__(self) -> bool:
    return bool(self.counts)

  def as_dict(self) -> dict[str, int]:
    return dict(sorted(self.counts.items()))

  def summary(self) -> str:
    if not self.counts:
      return f'{self.job}: nothing skipped.'
    lines = [f'{self.job}: {sum(self.counts.values()):,} skipped or repaired:']
    for reason, count in sorted(self.counts.items()):
      where = ', '.join(self.examples[reason])
      lines.append(f'  {reason}: {count:,}' + (f' (e.g. {where})' if where
                                                 else ''))
    return '\n'.join(lines)


def parse_json_line(raw: bytes, where: str, report: SkipReport):
  """One JSONL line, or None after counting why it is unreadable."""
  try:
    return json.loads(raw.decode('utf-8'))
  except UnicodeDecodeError:
    report.add('not UTF-8', where)
  except json.JSONDecodeError:
    report.add('invalid JSON', where)
  return None
