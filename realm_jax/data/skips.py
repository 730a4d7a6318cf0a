"""Counting what a long job skipped and why, reported once at its end."""

import collections
import json


class SkipReport:
  """Counts skipped or repaired inputs by reason, keeping a few locations each.

  Jobs call `add(reason, where)` instead of crashing or dropping silently, and
  print `summary()` when they finish. A job that reads rows also calls
  `keep()` for each row it keeps: its summary then ends with the share of
  rows skipped when over `NOTABLE_SHARE`, since figures on the rest are
  biased towards the rows that read.
  """

  NOTABLE_SHARE = 0.01

  def __init__(self, job: str, examples_per_reason: int = 3):
    self.job = job
    self.counts: collections.Counter = collections.Counter()
    self.examples: dict[str, list[str]] = collections.defaultdict(list)
    self.skipped: collections.Counter = collections.Counter()
    self.kept = 0
    self._keep = examples_per_reason

  def add(self, reason: str, where: str = '', skipped: bool = True) -> None:
    """Counts one input; `skipped`: it was dropped, not repaired."""
    self.counts[reason] += 1
    if skipped:
      self.skipped[reason] += 1
    if where and len(self.examples[reason]) < self._keep:
      self.examples[reason].append(where)

  def keep(self) -> None:
    self.kept += 1

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
    skipped = sum(self.skipped.values())
    rows = self.kept + skipped
    if self.kept and skipped > self.NOTABLE_SHARE * rows:
      lines.append(
          f'{skipped:,} of {rows:,} rows skipped ({skipped / rows:.1%}, over '
          f'{self.NOTABLE_SHARE:.0%}): ' + ', '.join(
              f'{reason} {count:,}' for reason, count in
              sorted(self.skipped.items())) + '; figures are on the rest.')
    return '\n'.join(lines)


def parse_json_object(raw: bytes, where: str, report: SkipReport
                      ) -> dict | None:
  """One JSONL record, or None after counting why the line is not one.

  Besides JSONDecodeError, json raises ValueError on an integer of over 4,300
  digits and RecursionError on arrays nested some thousand deep: a bad line
  all the same, not a reason to stop a long job. A line `null` is valid JSON
  but no record: counted, not taken for a line that failed.
  """
  try:
    row = json.loads(raw.decode('utf-8'))
  except UnicodeDecodeError:
    report.add('not UTF-8', where)
    return None
  except (ValueError, RecursionError):
    report.add('invalid JSON', where)
    return None
  if not isinstance(row, dict):
    report.add('not a JSON object', where)
    return None
  return row


def is_text(value) -> bool:
  """Is `value` a string that UTF-8 can hold? A JSON escape (or a Python
  literal) of a lone surrogate, '\\ud800', decodes to a str that cannot be
  encoded again, to tokenize, hash or write."""
  if not isinstance(value, str):
    return False
  try:
    value.encode('utf-8')
  except UnicodeEncodeError:
    return False
  return True
