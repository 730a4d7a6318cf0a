"""The benchmark runner: prints a table and writes
benchmarks/results/<machine>-<date>.json.

  python -m benchmarks.run [--quick] [--only mips]

Absolute figures hold for the machine named in the file; comparisons are
the rows of one run, measured side by side.
"""

import argparse
import datetime
import json
import os
import platform

from benchmarks import embed, encoder, mips, train_step

BENCHMARKS = {'encoder': encoder.run, 'train_step': train_step.run,
              'embed': embed.run, 'mips': mips.run}
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
  rows = [row for name in args.only or BENCHMARKS
          for row in BENCHMARKS[name](args)]
  for name in dict.fromkeys(row['benchmark'] for row in rows):
    print(f'\n{name}\n' + table([r for r in rows if r['benchmark'] == name]))
  info = machine()
  os.makedirs(args.output_dir, exist_ok=True)
  path = os.path.join(args.output_dir, f'{info["name"]}-'
                      f'{datetime.date.today().isoformat()}'
                      f'{"-quick" if args.quick else ""}.json')
  with open(path, 'w', encoding='utf-8') as f:
    json.dump({'machine': info, 'quick': args.quick, 'rows': rows}, f,
              indent=2)
  print(f'wrote {path}')
  return path


if __name__ == '__main__':
  main()
