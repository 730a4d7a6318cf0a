"""The benchmark runner: prints a table per benchmark and writes
benchmarks/results/<machine>-<date>.json (docs/benchmarks.md reads it).

  python -m benchmarks.run [--quick] [--only encoder|train_step|embed|mips|sharing|saves]
      [--paper_scale] [--index_dir DIR]
  python -m benchmarks.run --accelerator [--quick] [--budget_s 400]

Absolute figures hold for the machine named in the file; comparisons are
the rows of one run, measured side by side.

`--accelerator` runs the rows of one accelerator (docs/benchmarks.md, "On a
GPU"): the exact-search sweep, the encoder against PyTorch's on the same
card, corpus embedding, each in bfloat16, what a checkpoint and a retriever
snapshot cost the training loop, and last the REALM train step at the
paper's shapes; compiles included, in `--budget_s` seconds (default 400: under 7
minutes with the start-up). Each benchmark has its share of the budget
(ACCELERATOR_SHARES; what one leaves goes to the next), and a row starts
only while its share has room for it: the rows not started say so. Its
compiles go to a persistent compilation cache of its own, empty at the
start (as `realm-jax` commands keep one), so the train step's row from the
cache reads what the row before it compiled. With --quick it is a smoke run
at tiny sizes, on any machine.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import tempfile
import time

from benchmarks import embed, encoder, mips, saves, sharing, train_step

BENCHMARKS = {'encoder': encoder.run, 'train_step': train_step.run,
              'embed': embed.run, 'mips': mips.run, 'sharing': sharing.run,
              'saves': saves.run}
# In the order they run: the train step last, whose unrolled row compiles
# longest, so a run stopped at its hard limit keeps the others' JSON.
ACCELERATOR = {'mips': mips.run_sweep, 'encoder': encoder.accelerator,
               'embed': embed.accelerator, 'saves': saves.accelerator,
               'train_step': train_step.accelerator}
# Shares of --budget_s, in order (weights of what is left); from one H100's
# run of 353 s (2026-11-27): the sweep about 30 s (the 13.35M-row table and
# a compile per selection), the encoder 72, embedding 28, ten saves of 0.5
# GiB 13, the train step 206 (the compiles of its four rows).
ACCELERATOR_SHARES = {'mips': 0.15, 'encoder': 0.22, 'embed': 0.1,
                      'saves': 0.04, 'train_step': 0.49}
ACCELERATOR_BUDGET_S = 400
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'results')


def machine() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  info = {'name': f'{device.platform}-{os.cpu_count()}cpu',
          'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'devices': jax.device_count(),
          'device_kind': device.device_kind, 'jax': jax.__version__}
  if device.platform != 'cpu':  # The accelerator names the machine.
    kind = re.sub(r'[^a-z0-9]+', '-', device.device_kind.lower()).strip('-')
    info['name'] = f'{kind}-x{jax.device_count()}'
  try:
    import torch  # pylint: disable=g-import-not-at-top
    info['torch'] = torch.__version__
  except ImportError:
    pass
  return info


def table(rows: list[dict]) -> str:
  columns = sorted({k for row in rows for k in row},
                   key=lambda k: (k != 'benchmark', k))
  cell = lambda v: (f'{v:,.4g}' if isinstance(v, float) else
                    f'{v:,}' if isinstance(v, int) else str(v))
  lines = ['| ' + ' | '.join(columns) + ' |',
           '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(cell(row.get(c, '')) for c in columns) + ' |'
            for row in rows]
  return '\n'.join(lines)


# The accelerator tables of docs/benchmarks.md ("On a GPU"): (heading,
# column title, row key, format) per benchmark; a row that did not run
# shows why in the last column.
def _ms(v):
  return f'{v:.2f}'


def _percent(v):
  return f'{100 * v:.1f}%'


def _number(v):
  return f'{v:,.4g}' if isinstance(v, float) else f'{v:,}'


ACCELERATOR_COLUMNS = {
    'encoder': ('Encoder forward, bfloat16, ours against PyTorch', [
        ('device', 'device', str), ('compiler', 'compiler', str),
        ('model', 'model', str), ('params', 'param_dtype', str),
        ('compiled as', 'forward_only',
         lambda v: 'forward only' if v else "a training step's forward"),
        ('batch x length', None,
         lambda row: f'{row["batch"]} x {row["length"]}'),
        ('ours ms', 'ours_ms', _ms), ('PyTorch ms', 'theirs_ms', _ms),
        ('time ours/theirs', 'time_ratio', lambda v: f'**{v:.2f}**'),
        ('ours TFLOP/s', 'ours_tflop_per_s', _number),
        ('max abs diff', 'max_abs_diff', _number)]),
    'train_step': ('REALM pre-training step, paper shapes, bfloat16', [
        ('device', 'device', str), ('compiler', 'compiler', str),
        ('model', 'model', str), ('setup', 'setup', str),
        ('batch', 'batch', _number), ('remat', 'remat', str),
        ('layers a scan trip', 'scan_unroll', _number),
        ('compiled', 'compiled', str), ('step ms', 'step_ms', _ms),
        ('examples/s', 'examples_per_s', _number),
        ('model TFLOP/step', 'model_tflop_per_step', _number),
        ('MFU', 'mfu', _percent),
        ('first step s (compile)', 'first_step_s', _number),
        ('peak GiB', 'peak_memory_gib', _number)]),
    'embed': ('Corpus embedding, 288 wordpieces, bfloat16', [
        ('device', 'device', str), ('compiler', 'compiler', str),
        ('model', 'model', str), ('batch', 'batch', _number),
        ('blocks/s', 'docs_per_s', lambda v: f'{v:,.0f}'),
        ('GFLOP/block', 'gflop_per_doc', _number), ('MFU', 'mfu', _percent),
        ('refresh of 13.35M, 1 chip (h)', 'refresh_hours_1_chip', _number)]),
    'mips': ('Exact search, top-8 of 512 queries, bfloat16 rows', [
        ('device', 'device', str), ('compiler', 'compiler', str),
        ('rows', 'rows', _number), ('program', 'program', str),
        ('method', 'method', str), ('chunk', 'chunk_size', _number),
        ('group', 'group', str), ('unroll', 'unroll', _number),
        ('ms', 'ms', _ms), ('bound ms', 'bound_ms', _ms),
        ('scores floor ms', 'scores_round_trip_ms', _ms),
        ('x bound', 'ratio_to_bound', lambda v: f'{v:.1f}'),
        ('same ids', 'same_ids', lambda v: f'{v:.4f}')]),
    'saves': ('Saving for the index builder, the GPU preset\'s state', [
        ('device', 'device', str), ('compiler', 'compiler', str),
        ('saved', 'saved', str), ('GiB a save', 'gib_per_save', _number),
        ('save holds the loop (s)', 'blocked_s', _number),
        ('write behind it (s)', 'write_s', _number)]),
}


def accelerator_table(name: str, rows: list[dict]) -> str:
  """`rows` of one accelerator benchmark as docs/benchmarks.md's table."""
  heading, columns = ACCELERATOR_COLUMNS[name]
  titles = [title for title, _, _ in columns] + ['not run']
  lines = [f'### {heading}', '', '| ' + ' | '.join(titles) + ' |',
           '|' + '---|' * len(titles)]
  for row in rows:
    cells = []
    for _, key, form in columns:
      if key is None:
        try:
          cells.append(form(row))
        except KeyError:
          cells.append('')
      else:
        cells.append('' if row.get(key) in (None, '') else form(row[key]))
    cells.append(str(row.get('skipped') or row.get('error') or
                     row.get('skipped_theirs') or ''))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


@contextlib.contextmanager
def _fresh_compilation_cache():
  """JAX's persistent compilation cache in a new empty directory while the
  run lasts: every compile is cold, and a later one of the same program
  reads it. The process's own settings come back after (the tests run it
  in theirs)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  names = ('jax_compilation_cache_dir',
           'jax_persistent_cache_min_compile_time_secs')
  before = {name: getattr(jax.config, name) for name in names}
  directory = tempfile.mkdtemp(prefix='xla-cache-')
  jax.config.update(names[0], directory)
  jax.config.update(names[1], 0.0)
  try:
    yield directory
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
    shutil.rmtree(directory, ignore_errors=True)


def _time_left(deadline: float):
  return lambda: deadline - time.perf_counter()


def _run_each(args, benchmarks: dict, names: list, deadline: float,
              info: dict, path: str, rows: list, tables: list) -> None:
  """Runs `names` in order, rewriting the JSON at `path` after each (rows of
  other benchmarks kept); on an accelerator each in its share of what is
  left before `deadline`, its table appended to `tables`."""
  for index, name in enumerate(names):
    if args.accelerator:
      # This benchmark's share of what is left, the later ones' kept.
      later = sum(ACCELERATOR_SHARES[n] for n in names[index:])
      left = deadline - time.perf_counter()
      args.time_left = _time_left(time.perf_counter() + max(0.0, left) *
                                  ACCELERATOR_SHARES[name] / later)
      print(f'\n{name}: {max(0.0, left) * ACCELERATOR_SHARES[name] / later:.0f}'
            f' s of the {max(0.0, left):.0f} s left', flush=True)
    began = time.perf_counter()
    if args.accelerator and left <= 0:
      new = [{'benchmark': name, 'skipped': f'time budget of '
                                            f'{args.budget_s:.0f} s spent'}]
    else:
      new = benchmarks[name](args)
    if args.accelerator:
      tables.append(accelerator_table(name, new))
      print(f'{name} took {time.perf_counter() - began:.0f} s', flush=True)
    print(f'\n{name}\n' + table(new), flush=True)
    rows = [row for row in rows if row['benchmark'] != name
            and not (name == 'mips' and row['benchmark'] == 'mips_sweep')]
    rows += new
    with open(f'{path}.tmp', 'w', encoding='utf-8') as f:
      json.dump({'machine': info, 'quick': args.quick,
                 'accelerator': args.accelerator, 'rows': rows}, f, indent=2)
    os.replace(f'{path}.tmp', path)


def main(argv=None) -> str:
  started = time.perf_counter()
  parser = argparse.ArgumentParser(prog='python -m benchmarks.run',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='Small sizes: a smoke run in seconds.')
  parser.add_argument('--only', choices=tuple(BENCHMARKS), action='append',
                      help='Repeatable; default every benchmark.')
  parser.add_argument('--output_dir', default=RESULTS_DIR)
  parser.add_argument('--index_dir', default=mips.DEMO_INDEX,
                      help='A published index whose real corpus embeddings '
                      'mips searches (default: the demo pre-training run\'s).')
  parser.add_argument('--paper_scale', action='store_true',
                      help='mips also at 13,353,718 rows (about 14 GB of '
                      'memory and half an hour on 2 cores).')
  parser.add_argument('--accelerator', action='store_true',
                      help='The rows of one accelerator, in bfloat16: '
                      'encoder against PyTorch, the train step at the '
                      'paper\'s shapes, embedding, the exact-search sweep.')
  parser.add_argument('--budget_s', type=float, default=ACCELERATOR_BUDGET_S,
                      help='--accelerator: seconds for all its rows, '
                      'counted from the start (default %(default)s).')
  args = parser.parse_args(argv)
  info = machine()
  os.makedirs(args.output_dir, exist_ok=True)
  suffix = (('-accelerator' if args.accelerator else '')
            + ('-quick' if args.quick else ''))
  path = os.path.join(args.output_dir, f'{info["name"]}-'
                      f'{datetime.date.today().isoformat()}{suffix}.json')
  benchmarks = ACCELERATOR if args.accelerator else BENCHMARKS
  names = [name for name in (args.only or benchmarks) if name in benchmarks]
  # Rows of other benchmarks from an earlier run on this machine and day
  # stay; the file is rewritten after each benchmark, so a crash loses only
  # the one running.
  rows = []
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      rows = json.load(f)['rows']
  deadline = started + args.budget_s
  tables = []
  with (_fresh_compilation_cache() if args.accelerator
        else contextlib.nullcontext()):
    _run_each(args, benchmarks, names, deadline, info, path, rows, tables)
  if tables:
    total = time.perf_counter() - started
    print(f'\n## {info["device_kind"]}, {datetime.date.today().isoformat()}: '
          f'{total:.0f} s in all, budget {args.budget_s:.0f} s\n')
    print('\n\n'.join(tables), flush=True)
  print(f'wrote {path}')
  return path


if __name__ == '__main__':
  main()
