"""How fast `ask`, `fill` and `search` start, and where their seconds go.

  python -m benchmarks.startup [--finetune runs/demo/finetune_realm]
      [--pretrain runs/demo/realm] [--repeats 3]
      [--output docs/results/startup.json]

Each command is run as a user runs it, a fresh `realm-jax` process with one
input: once with an empty compilation cache, then `--repeats` times, for the
median whole-process wall time and the peak resident memory. Then one process per command is taken apart: the imports,
and the predictor's own phases (`RestoredRun.stopwatch`: the saved config,
the parameters, the corpus and index, the block texts), the first answer
(which compiles, or reads what an earlier process compiled from JAX's
compilation cache) and a second one. It prints a table and writes JSON,
with the CPU and its measured matmul rate.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from realm_jax.main import CACHE_ENV

# One child's phases, printed as JSON on its last line.
_PHASES = r'''
import json, sys, time
start = time.perf_counter()
command, model_dir, text = sys.argv[1:4]
from realm_jax import main
from realm_jax.evaluation import prediction
main.use_compilation_cache()  # As the command does.
imported = time.perf_counter() - start
if command == 'fill':
  predictor = prediction.ClozePredictor(model_dir)
  call = predictor.fill
elif command == 'ask':
  predictor = prediction.QAPredictor(model_dir, top_k=1, answers_only=True)
  call = predictor.ask
else:
  predictor = prediction.QAPredictor(model_dir, top_k=5, read=False)
  call = predictor.search
seconds = {'imports': imported, **predictor.stopwatch.seconds}
tick = time.perf_counter()
call(text)
first = time.perf_counter() - tick
texts = predictor.stopwatch.seconds.get('texts', 0.0)  # Read at first use.
seconds['texts'] = texts
seconds['first call (compiles)'] = first - texts
tick = time.perf_counter()
call(text)
seconds['second call'] = time.perf_counter() - tick
print(json.dumps(seconds))
'''

INPUTS = {'ask': 'who wrote the origin of species?',
          'fill': 'The [MASK] is the currency of the United Kingdom.',
          'search': 'origin of species author'}


def _timed(argv: list[str], env=None) -> tuple[float, float, str]:
  """(wall seconds, peak RSS in GB, stdout) of one child process."""
  start = time.perf_counter()
  child = subprocess.Popen(argv, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
  _, status, usage = os.wait4(child.pid, 0)
  wall = time.perf_counter() - start
  out, err = child.communicate()
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f'{" ".join(argv)} failed:\n{err[-2000:]}')
  return wall, usage.ru_maxrss / 1e6, out


def measure(runs: dict[str, str], repeats: int) -> dict:
  results = {}
  for command, model_dir in runs.items():
    text = INPUTS[command]
    argv = [sys.executable, '-m', 'realm_jax.main', command, text,
            f'--model_dir={model_dir}']
    with tempfile.TemporaryDirectory() as empty:  # Nothing compiled yet.
      cold, _, _ = _timed(argv, {**os.environ, CACHE_ENV: empty})
    walls, peaks = [], []
    for _ in range(repeats):
      wall, peak, _ = _timed(argv)
      walls.append(wall)
      peaks.append(peak)
    _, _, out = _timed([sys.executable, '-c', _PHASES, command, model_dir,
                        text])
    results[command] = {
        'model_dir': model_dir, 'input': text, 'cold_wall_s': cold,
        'wall_s': walls,
        'median_wall_s': statistics.median(walls), 'peak_rss_gb': max(peaks),
        'phases_s': json.loads(out.strip().splitlines()[-1])}
    print(f'{command}: median {results[command]["median_wall_s"]:.2f} s',
          file=sys.stderr, flush=True)
  return results


def table(results: dict) -> str:
  phases = list(dict.fromkeys(
      phase for r in results.values() for phase in r['phases_s']))
  lines = ['| | ' + ' | '.join(results) + ' |',
           '|---|' + '---|' * len(results),
           '| first process, nothing compiled yet (s) | ' + ' | '.join(
               f'{r["cold_wall_s"]:.2f}' for r in results.values()) + ' |',
           '| whole process, median wall (s) | ' + ' | '.join(
               f'{r["median_wall_s"]:.2f}' for r in results.values()) + ' |',
           '| peak RSS (GB) | ' + ' | '.join(
               f'{r["peak_rss_gb"]:.2f}' for r in results.values()) + ' |']
  for phase in phases:
    lines.append(f'| {phase} (s) | ' + ' | '.join(
        f'{r["phases_s"][phase]:.2f}' if phase in r['phases_s'] else '-'
        for r in results.values()) + ' |')
  return '\n'.join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--finetune', default='runs/demo/finetune_realm',
                      help='The fine-tuning run `ask` and `search` use.')
  parser.add_argument('--pretrain', default='runs/demo/realm',
                      help='The pre-training run `fill` uses.')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--output', default=None, help='Also write JSON here.')
  args = parser.parse_args(argv)
  from realm_jax.experiments import machine as machine_lib  # pylint: disable=g-import-not-at-top
  machine = machine_lib.machine()  # Before the children, alone.
  results = measure({'ask': args.finetune, 'search': args.finetune,
                     'fill': args.pretrain}, args.repeats)
  print(f'{machine["cpu"]}, {machine["cores"]} cores, 2048^3 float32 matmul '
        f'{machine["matmul_2048_gflops"]} GFLOP/s')
  print(table(results))
  if args.output:
    with open(args.output, 'w', encoding='utf-8') as f:
      json.dump({'machine': machine, 'repeats': args.repeats,
                 'commands': results}, f, indent=2)


if __name__ == '__main__':
  main()
