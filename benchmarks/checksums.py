"""What checking the CRC-32C of a run's files costs, against loading them.

  python -m benchmarks.checksums --model_dir=runs/demo/realm \
      --corpus_dir=runs/corpora/wiki_leads [--arrays_dir=DIR] \
      [--output docs/results/checksums.json]

Copies the run's newest checkpoint and index step (and the corpus's block
store) into a temporary directory twice: once with the checksums.json a
save writes now, once without (read unchecked). Then it times each load as
its reader does it on the copy without, beside the check alone: medians of
`--repeats`, the files in the page cache (each is read once first), as a
second start of a command finds them. Loads:
- a checkpoint's every item through Orbax (what a resuming trainer reads);
- the index as the trainer, `search` and `ask` load it (its searcher on
  the device), and its embeddings alone (a plain read);
- the block store as the trainer, `search` and `ask` load it (every block
  padded to the corpus's block length), and each file read whole (a plain
  read, which no reader does);
- 100 blocks' titles, bodies and wordpieces read from the memory-mapped
  store as `ask` shows them: there the check is of the pieces those reads
  touch, timed as the difference with the copy without checksums;
- exported arrays read whole.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import jax
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


def _copies(source: epath.Path, target: epath.Path, name: str, items: bool,
            pieces: bool = False) -> tuple[epath.Path, epath.Path]:
  """`source` copied to target/checked/`name`, with the checksums.json a
  save writes now in each item (or in the directory itself), and to
  target/unchecked/`name` without any."""
  copies = target / 'checked' / name, target / 'unchecked' / name
  for copy in copies:
    shutil.copytree(source, copy)
    for directory in ([p for p in copy.iterdir() if p.is_dir()] if items
                      else [copy]):
      (directory / checksums.MANIFEST).unlink(missing_ok=True)
      if copy == copies[0]:
        checksums.write(directory, pieces=pieces)
  return copies


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


def _blocks_shown(corpus_dir: str, ids: np.ndarray) -> None:
  store = block_store.open_store(corpus_dir, whole=False)
  for i in ids.tolist():
    store.title(i), store.body(i), store.token_ids(i)


def _newest(directory: epath.Path) -> epath.Path:
  return max((p for p in directory.iterdir() if p.name.isdigit()),
             key=lambda p: int(p.name))


def measure(model_dir: str, corpus_dir: str, work_dir: str,
            arrays_dir: str | None = None, repeats: int = 5) -> list[dict]:
  work = epath.Path(work_dir)
  rows = []
  step, _ = _copies(_newest(epath.Path(run_directory.checkpoints_dir(
      model_dir))), work / 'checkpoints', '0', items=True)
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
  metadata = corpus.load_metadata(corpus_dir)
  index, plain_index = _copies(_newest(epath.Path(run_directory.index_dir(
      model_dir))), work / 'index', '0', items=True)
  indexes = publication.index_manager(os.fspath(plain_index.parent),
                                      read_only=True)
  index_metadata = publication.read_metadata(indexes, 0)
  embeddings = index / run_directory.EMBEDDINGS
  rows.append(_row(
      'index, as the trainer, search and ask load it', embeddings,
      lambda: publication.load_index(
          indexes, 0, metadata, index_metadata['dim'],
          devices=jax.local_devices(),
          block_length=index_metadata.get('block_length')),
      lambda: [checksums.verify(item) for item in index.iterdir()
               if item.is_dir()], repeats))
  rows.append(_row(
      'index embeddings alone, a plain read', embeddings,
      lambda: indexes.restore(0, args=ocp.args.Composite(**{
          run_directory.EMBEDDINGS: publication.EmbeddingsRestore()})),
      lambda: checksums.verify(embeddings), repeats))
  name = f'{block_store.PREFIX}{metadata["corpus_fingerprint"][:16]}'
  store, plain_store = _copies(epath.Path(corpus_dir) / name,
                               work / 'corpus', name, items=False,
                               pieces=True)
  for copy in (store, plain_store):
    shutil.copy(epath.Path(corpus_dir) / corpus.METADATA, copy.parent)
  checked, unchecked = os.fspath(store.parent), os.fspath(plain_store.parent)
  length = metadata['max_block_length']
  rows.append(_row(
      f'block store, as the trainer, search and ask load it (padded to '
      f'{length})', store,
      lambda: block_store.open_store(unchecked).padded(length),
      lambda: checksums.verify(store), repeats))
  rows.append(_row('block store, each file a plain read', store,
                   lambda: _read_whole(plain_store, block_store.ARRAYS),
                   lambda: checksums.verify(store), repeats))
  ids = np.random.default_rng(0).integers(metadata['num_blocks'], size=100)
  plain_s = _median_s(lambda: _blocks_shown(unchecked, ids), repeats)
  checked_s = _median_s(lambda: _blocks_shown(checked, ids), repeats)
  rows.append({'what': '100 blocks shown by ask (their pieces checked)',
               'MiB': round(_bytes(store) / 2**20, 1),
               'load ms': round(1e3 * plain_s, 1),
               'check ms': round(1e3 * (checked_s - plain_s), 1),
               'check / load %': round(
                   100 * (checked_s - plain_s) / plain_s, 1)})
  for found in sorted(epath.Path(arrays_dir).glob(
      f'*/*/{example_arrays.METADATA}')) if arrays_dir else []:
    names = json.loads(found.read_text())['shapes']
    split = '/'.join(found.parent.parts[-2:])
    copy, plain = _copies(found.parent, work / 'arrays', split, items=False)
    rows.append(_row(f'arrays {split}, read whole', copy,
                     lambda plain=plain, names=names: _read_whole(plain,
                                                                  names),
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
  from realm_jax.experiments import machine as machine_lib
  with tempfile.TemporaryDirectory(prefix='realm-checksums-') as work_dir:
    rows = measure(args.model_dir, args.corpus_dir, work_dir,
                   args.arrays_dir, args.repeats)
  result = {'machine': machine_lib.machine(), 'repeats': args.repeats,
            'rows': rows}
  print(table(rows))
  print(json.dumps(result['machine']))
  if args.output:
    with open(args.output, 'w') as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
