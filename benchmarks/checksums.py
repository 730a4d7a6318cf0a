"""What checking the CRC-32C of a run's files costs, against loading them.

  python -m benchmarks.checksums --model_dir=runs/demo/realm \
      --corpus_dir=runs/corpora/wiki_leads [--arrays_dir=DIR] \
      [--output docs/results/checksums.json]

Copies the run's newest checkpoint and index step (and the corpus's block
store) into a temporary directory, gives every item its checksums.json as
a save does now, then times each load as its reader does it, without the
check, beside the check alone: medians of `--repeats`, the files in the
page cache (each is read once first), as a second start of a command finds
them. Loads: a checkpoint's every item through Orbax (what a resuming
trainer reads), an index's embeddings, a block store and exported arrays
opened memory-mapped and then read whole (their open alone reads no byte).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from benchmarks.run import table
from realm_jax import checksums, run_directory
from realm_jax.data import block_store, corpus, example_arrays
from realm_jax.index import publication


def _median_s(function, repeats: int) -> float:
  function()  # Into the page cache.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    function()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _bytes(directory: epath.Path) -> int:
  return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in
             os.walk(directory) for name in names)


def _with_checksums(source: epath.Path, target: epath.Path,
                    items: bool) -> epath.Path:
  """`source` copied to `target`, each item (or the directory itself) given
  the checksums.json a save writes now."""
  shutil.copytree(source, target)
  for directory in ([p for p in target.iterdir() if p.is_dir()] if items
                    else [target]):
    checksums.write(directory)
  return target


def _read_whole(directory: epath.Path, names) -> None:
  for name in names:
    np.array(np.load(os.fspath(directory / f'{name}.npy'), mmap_mode='r'))


def _row(what: str, directory: epath.Path, load, verify,
         repeats: int) -> dict:
  load_s, verify_s = _median_s(load, repeats), _median_s(verify, repeats)
  return {'what': what, 'MiB': round(_bytes(directory) / 2**20, 1),
          'load ms': round(1e3 * load_s, 1),
          'check ms': round(1e3 * verify_s, 1),
          'check / load %': round(100 * verify_s / load_s, 1)}


def _newest(directory: epath.Path) -> epath.Path:
  return max((p for p in directory.iterdir() if p.name.isdigit()),
             key=lambda p: int(p.name))


def measure(model_dir: str, corpus_dir: str, work_dir: str,
            arrays_dir: str | None = None, repeats: int = 5) -> list[dict]:
  work = epath.Path(work_dir)
  rows = []
  step = _with_checksums(_newest(epath.Path(
      run_directory.checkpoints_dir(model_dir))), work / 'checkpoints' / '0',
                         items=True)
  manager = ocp.CheckpointManager(os.fspath(step.parent),
                                  options=run_directory.reader_options())
  items = sorted(p.name for p in step.iterdir() if p.is_dir())
  restore_args = {name: run_directory.JsonRestore()
                  if name == run_directory.DATA_POSITION else
                  run_directory.StandardRestore() for name in items}
  rows.append(_row(
      f'checkpoint ({", ".join(items)})', step,
      lambda: manager.restore(0, args=ocp.args.Composite(**restore_args)),
      lambda: [checksums.verify(step / name) for name in items], repeats))
  index = _with_checksums(_newest(epath.Path(run_directory.index_dir(
      model_dir))), work / 'index' / '0', items=True)
  indexes = publication.index_manager(os.fspath(index.parent),
                                      read_only=True)
  embeddings = index / run_directory.EMBEDDINGS
  rows.append(_row(
      'index embeddings', embeddings,
      lambda: indexes.restore(0, args=ocp.args.Composite(**{
          run_directory.EMBEDDINGS: publication.EmbeddingsRestore()})),
      lambda: checksums.verify(embeddings), repeats))
  fingerprint = corpus.load_metadata(corpus_dir)['corpus_fingerprint']
  store = _with_checksums(
      epath.Path(corpus_dir) / f'{block_store.PREFIX}{fingerprint[:16]}',
      work / 'block_store', items=False)
  rows.append(_row('block store, read whole', store,
                   lambda: _read_whole(store, block_store.ARRAYS),
                   lambda: checksums.verify(store), repeats))
  for metadata in sorted(epath.Path(arrays_dir).glob(
      f'*/*/{example_arrays.METADATA}')) if arrays_dir else []:
    names = json.loads(metadata.read_text())['shapes']
    copy = _with_checksums(metadata.parent, work / 'arrays' / '/'.join(
        metadata.parent.parts[-2:]), items=False)
    rows.append(_row(f'arrays {"/".join(copy.parts[-2:])}, read whole', copy,
                     lambda copy=copy, names=names: _read_whole(copy, names),
                     lambda copy=copy: checksums.verify(copy), repeats))
  manager.close()
  indexes.close()
  return rows


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.checksums',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('--model_dir', required=True,
                      help='A run with checkpoints and a published index.')
  parser.add_argument('--corpus_dir', required=True)
  parser.add_argument('--arrays_dir', default=None,
                      help='Exported arrays (<task>/<split>/ each), if any.')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--output', default=None)
  args = parser.parse_args(argv)
  # pylint: disable-next=g-import-not-at-top
  from realm_jax import demo
  with tempfile.TemporaryDirectory(prefix='realm-checksums-') as work_dir:
    rows = measure(args.model_dir, args.corpus_dir, work_dir,
                   args.arrays_dir, args.repeats)
  result = {'machine': demo.machine(), 'repeats': args.repeats,
            'rows': rows}
  print(table(rows))
  print(json.dumps(result['machine']))
  if args.output:
    with open(args.output, 'w') as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
