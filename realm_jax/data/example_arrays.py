"""A task's examples, pre-tokenized, as memory-mapped arrays: the TF-free input.

The seqio tasks tokenize, mask and cut examples with TensorFlow ops. Written
once (`realm-jax data export`, the seqio source's `export`), the same
examples are one .npy file per feature, [count, *shape] at the shapes of the
run that reads them (uint8 or uint16 where every value fits, as wordpiece
ids of BERT's vocabularies do: a half or a quarter of the bytes to carry;
read back as int32),
beside `metadata.json`: the task, split and
preprocessing seed, the shapes, the vocabulary's and the corpus's
fingerprints (a reader refuses arrays made from another of either, naming
both), and a fingerprint of the arrays themselves. String features (an
Open-QA question and its answers) are one JSON line per example in
`strings.jsonl`.

Reading is random access, so the order is a pure function of the seed: the
examples of epoch e are permuted by `default_rng([seed, e])`, the epochs
follow each other, and global batch b is positions [b B, (b + 1) B) of that
stream. A run resumed after b batches starts at batch b with nothing read
twice or skipped; each process takes its own contiguous rows of every
global batch, so the global batch does not depend on the process count.
"""

import functools
import hashlib
import json
import os
from typing import Iterable, Iterator

import numpy as np
from etils import epath

from realm_jax import checksums, errors

ROOT_ENV = 'REALM_ARRAYS_DIR'
METADATA = 'metadata.json'
STRINGS = 'strings.jsonl'


def default_root() -> str:
  """$REALM_ARRAYS_DIR, else runs/arrays."""
  return os.environ.get(ROOT_ENV) or os.path.join('runs', 'arrays')


def directory(task: str, split: str, root: str | None = None) -> epath.Path:
  return epath.Path(root or default_root()) / task / split


def fixed(values, shape: tuple[int, ...], dtype=np.int32) -> np.ndarray:
  """A feature cut and zero-padded to `shape` (every dimension)."""
  values = np.asarray(values, dtype)
  out = np.zeros(shape, dtype)
  if values.ndim != len(shape):
    raise ValueError(f'A feature of shape {values.shape} cannot be made '
                     f'{shape}.')
  kept = tuple(slice(0, min(a, b)) for a, b in zip(values.shape, shape))
  out[kept] = values[kept]
  return out


def fingerprint(arrays: dict[str, np.ndarray]) -> str:
  """sha256 over the features' names, shapes and bytes."""
  digest = hashlib.sha256()
  for name in sorted(arrays):
    digest.update(f'{name}{arrays[name].shape}{arrays[name].dtype}'.encode())
    digest.update(np.ascontiguousarray(arrays[name]).tobytes())
  return digest.hexdigest()


def write(output: epath.Path, examples: Iterable[dict],
          shapes: dict[str, tuple[int, ...]], strings: tuple[str, ...] = (),
          **metadata) -> dict:
  """Writes `examples` (dicts of numpy features) at `shapes`, plus the
  `strings` features, into `output`: staged, then renamed, so that a killed
  export leaves none half written. Returns the metadata."""
  columns = {name: [] for name in shapes}
  texts = []
  for example in examples:
    for name, shape in shapes.items():
      columns[name].append(fixed(example[name], shape))
    if strings:
      texts.append(json.dumps({name: _text(example[name])
                               for name in strings}))
  count = len(next(iter(columns.values()))) if columns else 0
  if not count:
    raise errors.BadInput(f'No example to write to {output}.')
  arrays = {name: compact(np.stack(rows)) for name, rows in columns.items()}
  metadata = {**metadata, 'count': count,
              'shapes': {name: list(shape) for name, shape in shapes.items()},
              'strings': list(strings), 'fingerprint': fingerprint(arrays)}
  save(output, arrays, metadata,
       {STRINGS: ''.join(t + '\n' for t in texts)} if strings else {})
  return metadata


def save(output: epath.Path, arrays: dict[str, np.ndarray], metadata: dict,
         texts: dict[str, str] | None = None) -> None:
  """`arrays` as .npy files, `texts` (file name -> text), `metadata` and
  their CRC-32C (`checksums`) into `output`: staged, then renamed, so that a
  killed writer leaves none half written."""
  staged = output.parent / f'{output.name}.incomplete-{os.getpid()}'
  if staged.exists():
    staged.rmtree()
  staged.mkdir(parents=True)
  for name, values in arrays.items():
    np.save(os.fspath(staged / f'{name}.npy'), values)
  for name, text in (texts or {}).items():
    (staged / name).write_text(text)
  (staged / METADATA).write_text(json.dumps(metadata, indent=2))
  checksums.write(staged)
  if output.exists():
    output.rmtree()
  staged.rename(output)


def compact(values: np.ndarray) -> np.ndarray:
  """uint8 or uint16, the smallest where every value fits, else as it is."""
  if values.size and values.min() < 0:
    return values
  top = values.max() if values.size else 0
  for dtype in (np.uint8, np.uint16):
    if top <= np.iinfo(dtype).max:
      return values.astype(dtype)
  return values


def _text(value):
  """A string feature as JSON: bytes decoded, arrays as lists."""
  if isinstance(value, bytes):
    return value.decode('utf-8')
  if isinstance(value, np.ndarray):
    return [_text(v) for v in value.tolist()]
  if isinstance(value, list):
    return [_text(v) for v in value]
  return value


class ExampleArrays:
  """One split of a task, memory-mapped."""

  def __init__(self, path):
    self.path = epath.Path(path)
    self.metadata = read_metadata(
        self.path, 'pre-tokenized examples',
        'Write them where TensorFlow is, with `realm-jax data export` and '
        'the same gin files as the run (or bring a bundle).')
    self.count = self.metadata['count']
    self.arrays = load_arrays(self.path, self.metadata['shapes'])
    for name, values in self.arrays.items():
      if len(values) != self.count:
        raise errors.BadInput(f'{self.path / name}.npy: {len(values)} rows, '
                              f'but {self.path / METADATA} says {self.count}.')

  def check(self, shapes: dict, **expected) -> None:
    """Refuses arrays of other shapes, or made from another vocabulary or
    corpus (`expected`: metadata field -> value), naming both sides."""
    stored = {name: tuple(shape)
              for name, shape in self.metadata['shapes'].items()}
    wanted = {name: tuple(shape) for name, shape in shapes.items()}
    missing = sorted(set(wanted) - set(stored))
    if missing:
      raise errors.BadConfig(f'{self.path} has no features {missing}; it '
                             f'has {sorted(stored)}.')
    different = {n: (stored[n], s) for n, s in wanted.items()
                 if stored[n] != s}
    if different:
      raise errors.BadConfig(
          f'{self.path} holds examples of other shapes than the run reads: '
          + ', '.join(f'{n} {a} (arrays) vs {b} (run)'
                      for n, (a, b) in different.items()) + '.',
          'Export them again with the gin files and bindings of this run.')
    check_sources(self.path, self.metadata, expected)

  def rows(self, indices: np.ndarray, shapes: dict) -> dict[str, np.ndarray]:
    # Sorted reads from the memory map, then the batch's own order.
    order = np.argsort(indices, kind='stable')
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return {name: np.asarray(self.arrays[name][indices[order]], np.int32
                             )[inverse] for name in shapes}

  def strings(self) -> list[dict]:
    """Every example's string features, in example order."""
    path = self.path / STRINGS
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_sources(path, metadata: dict, expected: dict) -> None:
  """Refuses arrays whose metadata differs from `expected` (field -> value:
  the vocabulary's and the corpus's fingerprints), naming both."""
  for field, value in expected.items():
    if metadata.get(field) != value:
      raise errors.IndexMismatchError(
          f'{path} was made with {field} {metadata.get(field)}, but this run '
          f'reads {value}.',
          'Export the examples again from this corpus and vocabulary.')


def read_metadata(path: epath.Path, what: str, how: str) -> dict:
  """The metadata.json of arrays of `what` at `path`, once every file there
  matches its CRC-32C; a missing one is refused saying `how` to write them,
  an unreadable or changed file named."""
  meta = path / METADATA
  if not meta.is_file():
    raise errors.NotFound(f'No {what} at {path} ({METADATA} missing).', how)
  checksums.verify(path)
  try:
    return json.loads(meta.read_text())
  except ValueError as error:
    raise errors.BadInput(f'{meta}: not JSON ({error}).') from error


def load_arrays(path: epath.Path, names) -> dict[str, np.ndarray]:
  """<name>.npy of each of `names` at `path`, memory-mapped; an unreadable
  file named."""
  arrays = {}
  for name in names:
    file = path / f'{name}.npy'
    try:
      arrays[name] = np.load(os.fspath(file), mmap_mode='r')
    except (OSError, ValueError) as error:
      raise errors.BadInput(f'{file}: unreadable ({error}).') from error
  return arrays


def order(count: int, seed: int, shuffle: bool, start: int, stop: int
          ) -> np.ndarray:
  """Example indices of stream positions [start, stop): epoch after epoch,
  each permuted by its own seed (or in order, unshuffled)."""
  positions = np.arange(start, stop, dtype=np.int64)
  epochs, within = np.divmod(positions, count)
  if not shuffle:
    return within
  out = np.empty_like(within)
  for epoch in np.unique(epochs):
    here = epochs == epoch
    out[here] = _permutation(count, seed, int(epoch))[within[here]]
  return out


@functools.lru_cache(maxsize=2)  # This epoch's and the next.
def _permutation(count: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(count)


def stream(count: int, batch_size: int, seed: int = 0, shuffle: bool = True,
           num_epochs: int | None = None, skip_batches: int = 0,
           process_index: int = 0, process_count: int = 1,
           drop_remainder: bool = True
           ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """This process's rows of each global batch of a stream over `count`
  examples, from batch `skip_batches` on: their positions in the stream and
  the examples there."""
  if batch_size % process_count:
    raise errors.BadConfig(f'batch_size={batch_size} must divide over the '
                           f'{process_count} processes.')
  if not drop_remainder and process_count > 1:
    raise errors.BadConfig('drop_remainder=False needs a single process: '
                           'short last batches of several processes do not '
                           'line up.')
  end = None if num_epochs is None else num_epochs * count
  rows = batch_size // process_count
  batch = skip_batches
  while True:
    start = batch * batch_size
    stop = start + batch_size
    if end is not None and stop > end:
      if drop_remainder or start >= end:
        return
      stop = end
    positions = np.arange(start, stop, dtype=np.int64)
    indices = order(count, seed, shuffle, start, stop)
    if process_count > 1:
      mine = slice(process_index * rows, (process_index + 1) * rows)
      positions, indices = positions[mine], indices[mine]
    yield positions, indices
    batch += 1


def batches(examples: ExampleArrays, shapes: dict, batch_size: int,
            seed: int = 0, shuffle: bool = True,
            num_epochs: int | None = None, skip_batches: int = 0,
            process_index: int = 0, process_count: int = 1,
            drop_remainder: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of each global batch, from batch `skip_batches` on."""
  for _, indices in stream(examples.count, batch_size, seed, shuffle,
                           num_epochs, skip_batches, process_index,
                           process_count, drop_remainder):
    yield examples.rows(indices, shapes)
