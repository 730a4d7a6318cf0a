"""The benchmark runner: prints a table per benchmark and writes
benchmarks/results/<machine>-<date>.json (docs/benchmarks.md reads it).

  python -m benchmarks.run [--quick] [--only encoder|train_step|embed|mips|sharing]
      [--paper_scale] [--index_dir DIR]

Absolute figures hold for the machine named in the file; comparisons are
the rows of one run, measured side by side.
"""

import argparse
import datetime
import json
import os
import platform

from benchmarks import embed, encoder, mips, sharing, train_step

BENCHMARKS = {'encoder': encoder.run, 'train_step': train_step.run,
              'embed': embed.run, 'mips': mips.run, 'sharing': sharing.run}
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'results')


def machine() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  return {'name': f'{device.platform}-{os.cpu_count()}cpu',
          'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'devices': jax.device_count(),
          'device_kind': device.device_kind, 'jax': jax.__version__}


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


def main(argv=None) -> str:
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
  args = parser.parse_args(argv)
  info = machine()
  os.makedirs(args.output_dir, exist_ok=True)
  path = os.path.join(args.output_dir, f'{info["name"]}-'
                      f'{datetime.date.today().isoformat()}'
                      f'{"-quick" if args.quick else ""}.json')
  # Rows of other benchmarks from an earlier run on this machine and day
  # stay; the file is rewritten after each benchmark, so a crash loses only
  # the one running.
  rows = []
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      rows = json.load(f)['rows']
  for name in args.only or BENCHMARKS:
    new = BENCHMARKS[name](args)
    print(f'\n{name}\n' + table(new), flush=True)
    rows = [row for row in rows if row['benchmark'] != name] + new
    with open(f'{path}.tmp', 'w', encoding='utf-8') as f:
      json.dump({'machine': info, 'quick': args.quick, 'rows': rows}, f,
                indent=2)
    os.replace(f'{path}.tmp', path)
  print(f'wrote {path}')
  return path


if __name__ == '__main__':
  main()
