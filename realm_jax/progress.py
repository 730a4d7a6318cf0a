"""Progress lines for long work: done/total, rate and ETA, at most every few
s; and where a start-up's seconds go."""

import contextlib
import math
import sys
import time


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  return (f'{hours}h{rest // 60:02d}m' if hours else
          f'{rest // 60}m{rest % 60:02d}s')


def _decimals(total: float) -> int:
  """Decimals that show a fractional total to three significant figures
  (three decimals at most), so a 0.3 MB file reads 0.300/0.300, not 0/0."""
  if total <= 0 or float(total).is_integer() or total >= 100:
    return 0
  return min(3, 2 - math.floor(math.log10(total)))


class Progress:
  """Reports `update(n)` calls as '<what> 1,234/10,033 (12%) 85.3 docs/s ETA 1m43s'."""

  def __init__(self, what: str, total: int, unit: str = 'items',
               every_s: float = 5.0, stream=None, clock=time.monotonic,
               done: float = 0, also: tuple[float, str] | None = None):
    """`done`: already finished (a resumed run); `also`: (n, unit) for a
    second rate, e.g. (batch_size, 'examples') beside steps/s."""
    self.what, self.total, self.unit = what, total, unit
    self.every_s, self.stream, self.clock = every_s, stream, clock
    self.done = self._done_at_start = done
    self.also = also
    self.start = self._last = clock()

  @property
  def rate(self) -> float:
    elapsed = self.clock() - self.start
    return (self.done - self._done_at_start) / elapsed if elapsed > 0 else 0.0

  def line(self) -> str:
    rate, places = self.rate, _decimals(self.total)
    share = 100 * self.done / self.total if self.total > 0 else 100
    text = (f'{self.what} {self.done:,.{places}f}/{self.total:,.{places}f} '
            f'({share:.0f}%) {rate:.1f} {self.unit}/s')
    if self.also:
      text += f' {rate * self.also[0]:.1f} {self.also[1]}/s'
    if 0 < self.done < self.total and rate > 0:
      text += f' ETA {_duration((self.total - self.done) / rate)}'
    elif self.done >= self.total:
      text += f' in {_duration(self.clock() - self.start)}'
    return text

  def update(self, n: float) -> None:
    self.done += n
    now = self.clock()
    if now - self._last >= self.every_s or self.done >= self.total:
      self._last = now
      print(self.line(), file=self.stream or sys.stderr, flush=True)


class Stopwatch:
  """Seconds spent in named phases: `with stopwatch('parameters'): ...`."""

  def __init__(self, clock=time.perf_counter):
    self.seconds: dict[str, float] = {}
    self.clock = clock

  @contextlib.contextmanager
  def __call__(self, phase: str):
    start = self.clock()
    try:
      yield
    finally:
      self.seconds[phase] = self.seconds.get(phase, 0.0) + (
          self.clock() - start)

  def summary(self) -> str:
    return ', '.join(f'{phase} {s:.1f} s' for phase, s in self.seconds.items())
