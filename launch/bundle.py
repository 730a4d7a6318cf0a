"""A bundle that travels: what a GPU or TPU machine without TensorFlow needs to
run the core on the demo's data, in one directory of at most 64 MiB.

  python -m launch.bundle --output_dir=bundle      # build (needs the TF extra)
  python -m launch.bundle --check bundle           # verify (no TF needed)

The parts: wheels/ (what the GPU image lacks: gin-config and google-crc32c),
corpora/ (each corpus's metadata.json and block store, not its TFRecord shards), arrays/
(the runs' examples, pre-tokenized by the seqio source's `export`, as `realm-jax
data export` writes them: for pre-training, the corpus's sentences and
salient spans, which its queries are drawn from), minilm/ (MiniLM's
weights, config and the task vocabulary) and manifest.json (each part, its
size and files with their sha256, the fingerprints, the git commit, and the
environment and gin bindings that use it). docs/accelerators.md says how to
run with it.

The build is staged beside the output and renamed when whole and checked; a
bundle over the limit is refused, naming each part's size, and never written.
"""

import argparse
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
from etils import epath

from realm_jax import checksums, errors
from realm_jax.data import block_store, corpus, example_arrays

LIMIT_MIB = 64
MIB = 1 << 20
MANIFEST = 'manifest.json'
VOCAB = 'minilm/vocab.txt'
# What the GPU image (Python 3.12, jax 0.11 with CUDA 13, flax, optax, orbax,
# numpy 2, etils, safetensors, ...) lacks, and the wheels that fit it.
WHEELS = ('gin-config==0.5.0', 'google-crc32c==1.9.0')
TARGET_PYTHON = '3.12'
PLATFORMS = ('manylinux_2_28_x86_64', 'manylinux_2_17_x86_64',
             'manylinux2014_x86_64', 'any')
SETUP = 'gin/setups/demo.gin'
RUN_FILES = {'ict': 'gin/runs/ict.gin', 'pretrain': 'gin/runs/pretrain.gin',
             'finetune': 'gin/runs/finetune.gin'}
MINILM_FILES = ('model.safetensors', 'config.json')
# The parts, in the order they are built and listed.
PARTS = {
    'wheels': 'wheels the GPU image lacks: pip install --no-deps --target',
    'corpora': "each corpus's metadata.json and block store (no shards)",
    'arrays': "the runs' examples, pre-tokenized, and the salient spans "
              "pre-training draws from (Examples.source='arrays')",
    'minilm': 'MiniLM weights and config, and the task vocabulary',
}


class TooLarge(errors.UserError, ValueError):
  """A bundle that would exceed its size limit."""


def _has_nq() -> bool:
  """Whether $REALM_DATA_DIR holds nq_open, which NQ's runs read."""
  from realm_jax.data import open_qa  # pylint: disable=g-import-not-at-top
  data = os.environ.get(open_qa.DATA_DIR_ENV)
  return bool(data) and (epath.Path(data) / 'nq_open').is_dir()


def default_runs() -> list[tuple[str, ...]]:
  """The demo's ICT and pre-training runs, and NQ fine-tuning where
  $REALM_DATA_DIR holds nq_open: each run's gin files."""
  names = ['ict', 'pretrain'] + (['finetune'] if _has_nq() else [])
  return [(RUN_FILES[name], SETUP) for name in names]


def preset_corpus(name: str) -> None:
  """The leads' corpus as demo preset `name` reads it, cut at its block
  length: built and annotated where $REALM_CORPUS_DIR has none; one cut
  at another length is refused, not replaced (another preset's runs read
  it)."""
  from realm_jax.experiments import demo  # pylint: disable=g-import-not-at-top
  from realm_jax.experiments import preset as preset_lib  # pylint: disable=g-import-not-at-top
  block_length = preset_lib.load(name).stage('corpus').args['block_length']
  directory = corpus.corpus_dir('wiki_leads')
  if not (epath.Path(directory) / corpus.METADATA).exists():
    print(f'{directory}: the leads cut into blocks of at most {block_length} '
          'wordpieces, for the preset ' + repr(name))
    demo.build_corpus(block_length)
    return
  found = corpus.load_metadata(directory)['max_block_length']
  if found != block_length:
    raise errors.BadConfig(
        f'The corpus at {directory} is cut into blocks of {found} wordpieces; '
        f'the preset {name!r} reads {block_length}. Set '
        f'{corpus.CORPUS_ROOT_ENV} to another directory (`make bundle-gpu` '
        'uses runs/corpora-gpu), where its corpus is built.')


def preset_runs(name: str) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
  """(the runs of demo preset `name`, the splits it never reads): NQ's
  training questions stay behind unless the preset fine-tunes, and NQ's run
  is left out where $REALM_DATA_DIR lacks nq_open (the demo then skips
  recall)."""
  from realm_jax.experiments import demo  # pylint: disable=g-import-not-at-top
  from realm_jax.experiments import preset as preset_lib  # pylint: disable=g-import-not-at-top
  preset = preset_lib.load(name)
  runs = [run for run in demo.example_runs(preset)
          if _has_nq() or run[0] != RUN_FILES['finetune']]
  finetunes = any(stage.kind == 'train' and stage.args['run'] == 'finetune'
                  for stage in preset.stages)
  return runs, () if finetunes else ('nq_open/train',)


def _size(path: pathlib.Path) -> int:
  if path.is_file():
    return path.stat().st_size
  return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


def _wheels(target: pathlib.Path, requirements, wheels_from) -> list[str]:
  """Copied from `wheels_from`, else downloaded for the target Python."""
  target.mkdir()
  if wheels_from:
    found = sorted(pathlib.Path(wheels_from).glob('*.whl'))
    if not found:
      raise errors.NotFound(f'No wheel (*.whl) in {wheels_from}.')
    for wheel in found:
      shutil.copyfile(wheel, target / wheel.name)
  else:
    done = subprocess.run(
        [sys.executable, '-m', 'pip', 'download', '--no-deps',
         '--only-binary=:all:', f'--python-version={TARGET_PYTHON}',
         '--implementation=cp', *(f'--platform={p}' for p in PLATFORMS),
         '-d', os.fspath(target), *requirements],
        capture_output=True, text=True, check=False)
    if done.returncode:
      last = (done.stderr.strip().splitlines() or ['no output'])[-1]
      raise errors.NotFound(f'pip download {" ".join(requirements)} failed '
                            f'({last}); give --wheels_from=DIR instead.')
  return sorted(f.name for f in target.glob('*.whl'))


def _export(target: pathlib.Path, runs, bindings, leave_out=()
            ) -> tuple[list[dict], set]:
  """Each run's example splits as `realm-jax data export` writes them, but
  those named in `leave_out` ('task/split'); the runs as the manifest lists
  them (with the directories under arrays/ each reads), and the corpora
  they read."""
  import gin  # pylint: disable=g-import-not-at-top
  from realm_jax.input import arrays  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  listed, corpora, shapes = [], set(), {}
  try:
    for run in runs:
      files = [item for item in run if '=' not in item]
      own = [*bindings, *(item.replace('=', ' = ', 1) for item in run
                          if '=' in item)]
      run_loader.configure(files, own)
      configured = run_loader.configured_run()
      corpora.add(configured.run.corpus_name)
      splits = []
      for split in configured.run.example_splits():
        where = f'{split.task}/{split.split}'
        if where in leave_out:
          continue
        stored = os.fspath(arrays.directory(
            split.task, split.split, os.fspath(target)).relative_to(target))
        # Queries drawn from spans (stored elsewhere) take each run's shapes.
        if stored == where and shapes.get(where, split.shapes) != split.shapes:
          raise errors.BadConfig(
              f'Two runs export {where} at other shapes: {shapes[where]} and '
              f'{split.shapes} ({files[0]}).')
        if where not in shapes:
          written = configured.exporter().export(
              split.task, split.split, split.shapes, configured.seed,
              os.fspath(target), split.corpus_name, split.strings,
              split.metadata)
          shapes[where] = split.shapes
          print(f'{where}: {written["count"]:,} examples' + (
              '' if stored == where else f', drawn from {stored}'))
        if stored not in splits:
          splits.append(stored)
      listed.append({'kind': configured.kind, 'gin_files': files,
                     'gin_bindings': own, 'arrays': splits})
  finally:
    gin.clear_config()
  return listed, corpora


def _corpus(target: pathlib.Path, name: str) -> dict:
  """metadata.json as it is, and the block store the core reads (written
  from the shards here when the corpus has none yet)."""
  source = corpus.corpus_dir(name)
  metadata = corpus.load_metadata(source)
  store = block_store.open_store(source)
  directory = target / name / (
      f'{block_store.PREFIX}{metadata["corpus_fingerprint"][:16]}')
  directory.mkdir(parents=True)
  for array in block_store.ARRAYS:
    values = store.arrays[array]  # A store written before ids were compact:
    np.save(os.fspath(directory / f'{array}.npy'), example_arrays.compact(
        values) if array == 'token_ids' else values)
  checksums.write(directory, pieces=True)  # As block_store writes it.
  (target / name / corpus.METADATA).write_bytes(
      (epath.Path(source) / corpus.METADATA).read_bytes())
  return {'corpus_fingerprint': metadata['corpus_fingerprint'],
          'num_blocks': metadata['num_blocks'], 'source': source}


def _minilm(target: pathlib.Path, room: int) -> dict:
  """MiniLM's files and the task vocabulary; the weights in float32 when
  they fit in `room` bytes, else in float16: half the bytes, and what
  `pretrained.load_bert_params` reads (its safetensors reader has no
  bfloat16), 8x closer to MiniLM's float32 than bfloat16 is."""
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  source = pathlib.Path(default_files.minilm_dir())
  target.mkdir()
  shutil.copyfile(source / 'config.json', target / 'config.json')
  shutil.copyfile(default_files.task_vocab(), target / 'vocab.txt')
  weights = source / 'model.safetensors'
  if _size(weights) + _size(target) <= room:
    shutil.copyfile(weights, target / 'model.safetensors')
    return {'dtype': 'float32', 'source': os.fspath(source)}
  import safetensors  # pylint: disable=g-import-not-at-top
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
  with safetensors.safe_open(os.fspath(weights), framework='np') as f:
    metadata = f.metadata()
    tensors = {key: f.get_tensor(key) for key in f.keys()}
  half = {key: value.astype(np.float16) if value.dtype == np.float32
          else value for key, value in tensors.items()}
  overflowing = [key for key, value in half.items()
                 if value.dtype == np.float16 and not np.isfinite(value).all()]
  if overflowing:
    raise errors.BadInput(f'{weights}: {overflowing} overflow float16.')
  safetensors_numpy.save_file(half, os.fspath(target / 'model.safetensors'),
                              metadata)
  return {'dtype': 'float16', 'source': os.fspath(source)}


def _git() -> dict:
  """The checkout's commit, and whether files differ from it."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = lambda *argv: subprocess.run(['git', '-C', root, *argv],
                                     capture_output=True, text=True,
                                     check=False)
  head = run('rev-parse', 'HEAD')
  if head.returncode:
    return {'git_commit': None}
  return {'git_commit': head.stdout.strip(),
          'git_dirty': bool(run('status', '--porcelain').stdout.strip())}


def usage(bundle_dir: str) -> dict:
  """How a machine uses the bundle at `bundle_dir`."""
  minilm = os.path.join(bundle_dir, 'minilm')
  return {
      'install': 'pip install --no-deps --target /tmp/site '
                 f'{os.path.join(bundle_dir, "wheels")}/*.whl',
      'env': {'PYTHONPATH': '/tmp/site',
              corpus.CORPUS_ROOT_ENV: os.path.join(bundle_dir, 'corpora'),
              'REALM_ARRAYS_DIR': os.path.join(bundle_dir, 'arrays'),
              'REALM_VOCAB': os.path.join(bundle_dir, VOCAB)},
      'gin_bindings': ["Examples.source = 'arrays'",
                       *(f"{kind}.bert_dir = '{minilm}'"
                         for kind in ('Ict', 'Pretrain', 'Finetune'))],
      'check': f'python -m launch.bundle --check {bundle_dir}',
  }


def _too_large(sizes: dict, limit: int) -> str | None:
  total = sum(sizes.values())
  if total <= limit:
    return None
  return (f'A bundle of {total / MIB:.1f} MiB exceeds the {limit / MIB:g} MiB '
          'limit: ' + ', '.join(f'{name} {size / MIB:.1f} MiB'
                                for name, size in sizes.items()) + '.')


def build(output_dir: str = 'bundle', runs=None, bindings=(),
          wheels=WHEELS, wheels_from: str | None = None,
          limit: int = LIMIT_MIB * MIB, leave_out=()) -> dict:
  """Writes the bundle into `output_dir` (replacing a bundle there); returns
  its manifest. `runs`: each run's gin files (default: `default_runs()`),
  `bindings` layered over every run; an item of a run with '=' in it is a
  binding of that run alone. `leave_out`: splits ('task/split') not
  carried."""
  output = pathlib.Path(output_dir)
  if output.exists() and any(output.iterdir()) and not (
      output / MANIFEST).exists():
    raise errors.BadConfig(f'{output} exists and is not a bundle (no '
                           f'{MANIFEST}); give another --output_dir.')
  runs = [tuple(files) for files in (runs or default_runs())]
  staged = output.parent / f'{output.name}.incomplete-{os.getpid()}'
  if staged.exists():
    shutil.rmtree(staged)
  staged.mkdir(parents=True)
  try:
    parts = {name: {'what': what} for name, what in PARTS.items()}
    parts['wheels']['files'] = _wheels(staged / 'wheels', wheels, wheels_from)
    if not wheels_from:
      parts['wheels']['requested'] = list(wheels)
    parts['arrays']['runs'], names = _export(staged / 'arrays', runs,
                                             bindings, leave_out)
    (staged / 'corpora').mkdir()
    parts['corpora']['corpora'] = {
        name: _corpus(staged / 'corpora', name) for name in sorted(names)}
    room = limit - sum(_size(staged / name) for name in PARTS if name != 'minilm')
    parts['minilm'].update(_minilm(staged / 'minilm', room))
    files = sorted(f for f in staged.rglob('*') if f.is_file())
    manifest = {
        'built': datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec='seconds'),
        **_git(),
        'limit_bytes': limit,
        'vocab_fingerprint': corpus.vocab_hash(staged / VOCAB),
        'corpus_fingerprints': {name: corpus_['corpus_fingerprint'] for
                                name, corpus_ in
                                parts['corpora']['corpora'].items()},
        'parts': {name: {'bytes': _size(staged / name), **part}
                  for name, part in parts.items()},
        'use': usage(output_dir),
        'files': {os.fspath(f.relative_to(staged)): {
            'bytes': f.stat().st_size, 'sha256': checksums.sha256(f)} for f in files},
    }
    text = json.dumps(manifest, indent=1)
    sizes = {name: part['bytes'] for name, part in manifest['parts'].items()}
    refusal = _too_large({**sizes, MANIFEST: len(text.encode())}, limit)
    if refusal:
      raise TooLarge(refusal)
    (staged / MANIFEST).write_text(text)
    check(staged)
    if output.exists():
      shutil.rmtree(output)
    staged.rename(output)
  finally:
    if staged.exists():
      shutil.rmtree(staged)
  return manifest


def table(manifest: dict, bundle_dir: str) -> str:
  """The parts, their files and sizes, as a fixed-width table."""
  rows = [(name, len([f for f in manifest['files'] if f.startswith(name + '/')]),
           part['bytes'], part['what']) for name, part in
          manifest['parts'].items()]
  rows.append((MANIFEST, 1, _size(pathlib.Path(bundle_dir) / MANIFEST), ''))
  rows.append(('total', sum(r[1] for r in rows), sum(r[2] for r in rows),
               f'limit {manifest["limit_bytes"] / MIB:g} MiB'))
  lines = [f'{"part":<14}{"files":>6}{"bytes":>13}{"MiB":>8}  what']
  lines += [f'{name:<14}{count:>6}{size:>13,}{size / MIB:>8.2f}  {what}'
            for name, count, size, what in rows]
  return '\n'.join(lines)


def _json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except ValueError as error:
    raise errors.BadInput(f'{path} is damaged: not JSON ({error}).') from error


def _same(what: str, found, where: str, expected, source: str) -> None:
  if found != expected:
    raise errors.IndexMismatchError(
        f'{where} was made with {what} {found}, but {source} is {expected}: '
        'parts of two bundles; build it again.')


def check(bundle_dir) -> dict:
  """Refuses a bundle whose parts do not belong together (arrays or a
  corpus made from another vocabulary, arrays made from another corpus),
  naming both fingerprints, or whose files are missing or differ from the
  manifest. Reads no TensorFlow: the GPU command runs it first."""
  root = pathlib.Path(bundle_dir)
  if not (root / MANIFEST).is_file():
    raise errors.NotFound(f'{root} is not a bundle: it has no {MANIFEST}.')
  manifest = _json(root / MANIFEST)
  errors.require_file(root / VOCAB, "bundle's vocabulary")
  vocab = corpus.vocab_hash(root / VOCAB)
  vocab_source = f'its vocabulary {root / VOCAB}'
  corpora = {}
  for path in sorted(root.glob(f'corpora/*/{corpus.METADATA}')):
    metadata = _json(path)
    _same('vocabulary', metadata['vocab_hash'], f'corpus {path.parent}',
          vocab, vocab_source)
    corpora[path.parent.name] = metadata['corpus_fingerprint']
  arrays = sorted(root.glob('arrays/*/*/metadata.json'))
  for path in arrays:
    metadata = _json(path)
    _same('vocabulary', metadata['vocab_fingerprint'], f'{path.parent}',
          vocab, vocab_source)
    name = metadata.get('corpus_name')
    if name:
      if name not in corpora:
        raise errors.NotFound(f'{path.parent} was made from corpus {name}, '
                              'which the bundle lacks.')
      _same('corpus', metadata['corpus_fingerprint'], f'{path.parent}',
            corpora[name], f'its corpus {root / "corpora" / name}')
  for listed, expected in manifest['files'].items():
    path = root / listed
    if not path.is_file():
      raise errors.NotFound(f'{path} is missing (listed in {MANIFEST}).')
    digest = checksums.sha256(path)
    if digest != expected['sha256']:
      raise errors.BadInput(f'{path} is damaged: sha256 {digest}, but '
                            f'{MANIFEST} says {expected["sha256"]}.')
  for name, fingerprint in corpora.items():
    store = root / 'corpora' / name / f'{block_store.PREFIX}{fingerprint[:16]}'
    if not store.is_dir():
      raise errors.NotFound(f'{store} is missing: corpus {name} has no '
                            'block store.')
  return {'vocab_fingerprint': vocab, 'corpora': corpora,
          'arrays': len(arrays), 'files': len(manifest['files'])}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m launch.bundle', description=__doc__.split('\n\n')[0],
      epilog='Gin bindings also as --gin.X=V; they go to every run.')
  parser.add_argument('--output_dir', default='bundle')
  parser.add_argument('--check', metavar='DIR', default=None,
                      help='Verify the bundle in DIR instead of building.')
  parser.add_argument('--run', action='append', default=None,
                      metavar='GIN_FILE,GIN_FILE[,X=V]',
                      help='A run whose examples travel: its gin files and '
                      'its own bindings, comma-separated (repeatable; '
                      'default: the demo\'s ICT, '
                      'pre-training and, where $REALM_DATA_DIR has nq_open, '
                      'fine-tuning, each with gin/setups/demo.gin).')
  parser.add_argument('--gin_bindings', action='append', default=[])
  parser.add_argument('--preset', default=None,
                      help='The runs of `realm-jax demo --preset=PRESET` '
                      '(gpu: `make bundle-gpu`) instead of --run.')
  parser.add_argument('--wheel', action='append', default=[],
                      metavar='NAME==VERSION',
                      help=f'One more wheel to download (beside {WHEELS}).')
  parser.add_argument('--wheels_from', metavar='DIR', default=None,
                      help='Copy the *.whl files of DIR instead of '
                      'downloading (offline).')
  parser.add_argument('--limit_mib', type=float, default=LIMIT_MIB)
  return parser


def main(argv=None) -> int:
  """0 when built (or checked); a user error in one line, 2."""
  argv = sys.argv[1:] if argv is None else argv
  args = _parser().parse_args(
      [f'--gin_bindings={a[len("--gin."):].replace("=", " = ", 1)}'
       if a.startswith('--gin.') and '=' in a else a for a in argv])
  try:
    if args.check:
      summary = check(args.check)
      print(f'{args.check}: a whole bundle: {summary["arrays"]} example '
            f'arrays, corpora {summary["corpora"]}, vocabulary '
            f'{summary["vocab_fingerprint"]}, {summary["files"]} files as '
            f'{MANIFEST} lists them.')
    else:
      runs, leave_out = [r.split(',') for r in args.run or []] or None, ()
      if args.preset:
        preset_corpus(args.preset)
        runs, leave_out = preset_runs(args.preset)
      manifest = build(
          args.output_dir, runs, args.gin_bindings,
          WHEELS + tuple(args.wheel), args.wheels_from,
          int(args.limit_mib * MIB), leave_out)
      print(table(manifest, args.output_dir))
  except errors.UserError as error:
    print(f'launch.bundle: {errors.message(error)}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
