"""Reads the tensors of released checkpoints without TensorFlow or torch.

Google released REALM as TensorFlow tensor bundles (name-based checkpoints
and TF-Hub modules' `variables/variables`); Hugging Face hosts it as PyTorch
zip files (`pytorch_model.bin`) and safetensors. The hosts that import them
have neither framework, and one tensor, the [13353718, 128] `block_emb`, is
6.8 GB. So each format is parsed here just far enough to know where each
tensor's bytes lie (always C-order and little-endian: a file and an offset),
`read_rows` reads only the rows asked for, and `read` fills one fresh array
chunk by chunk. Every file is opened through etils.epath, so gs:// paths
read like local ones.

  - TF bundle: `PREFIX.index` is a LevelDB-format table mapping each tensor
    name to a BundleEntryProto (decoded here from the protobuf wire format);
    the bytes lie in `PREFIX.data-NNNNN-of-NNNNN`.
  - PyTorch zip: `<root>/data.pkl`, unpickled with only the globals a state
    dict needs, names each tensor's storage, the member `<root>/data/<key>`.
  - safetensors: an 8-byte header size, a JSON header, then the bytes.
"""

import collections
import dataclasses
import json
import math
import os
import pickle
import struct
import zipfile
from typing import Iterator

import ml_dtypes
import numpy as np
from etils import epath

from realm_jax import checksums
from realm_jax.errors import NotFound, TensorFileError

# A whole-tensor read holds one chunk beyond its output.
_CHUNK_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """A tensor's name, shape and dtype (object where it cannot be read)."""
  name: str
  shape: tuple[int, ...]
  dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class _Entry:
  """Where a tensor's bytes lie, or why they cannot be read."""
  info: TensorInfo
  file: epath.Path | None = None
  offset: int = 0  # Of the first byte in `file`.
  refusal: str | None = None
  crc32c: int | None = None  # TF's masked CRC32C of the bytes.


def _nbytes(info: TensorInfo) -> int:
  return info.dtype.itemsize * math.prod(info.shape)


def _read_bytes(file: epath.Path, offset: int, size: int, name: str
                ) -> tuple[np.ndarray, int]:
  """`size` bytes of tensor `name` from `offset`, read chunk by chunk into one
  fresh uint8 array, and their CRC-32C."""
  out = np.empty(size, np.uint8)
  done = crc = 0
  with file.open('rb') as f:
    f.seek(offset)
    while done < size:
      chunk = f.read(min(size - done, _CHUNK_BYTES))
      if not chunk:
        raise TensorFileError(
            f'{file} is truncated: tensor {name} needs bytes [{offset}, '
            f'{offset + size}), of which only {done} could be read.')
      out[done:done + len(chunk)] = np.frombuffer(chunk, np.uint8)
      done += len(chunk)
      crc = checksums.extend(crc, chunk)
  return out, crc


class TensorFile:
  """The named tensors of one checkpoint; made by `open_tensor_file`."""

  def __init__(self, path: str, entries: dict[str, _Entry]):
    self.path = path
    self._entries = entries

  def __repr__(self) -> str:
    return f'TensorFile({self.path!r}, {len(self._entries)} tensors)'

  def infos(self) -> dict[str, TensorInfo]:
    """Every tensor, including those `read` refuses (strings, views...)."""
    return {name: entry.info for name, entry in self._entries.items()}

  def _readable(self, name: str) -> _Entry:
    if name not in self._entries:
      raise KeyError(f'{self.path} has no tensor {name!r}')
    entry = self._entries[name]
    if entry.refusal:
      raise TensorFileError(
          f'{self.path}: cannot read tensor {name}: {entry.refusal}')
    return entry

  def read(self, name: str) -> np.ndarray:
    """The whole tensor, as a fresh array."""
    entry = self._readable(name)
    data, crc = _read_bytes(entry.file, entry.offset, _nbytes(entry.info),
                            name)
    if entry.crc32c is not None and checksums.masked(crc) != entry.crc32c:
      raise TensorFileError(
          f'{entry.file}: tensor {name} fails its CRC32C check: corrupt data.')
    return data.view(entry.info.dtype).reshape(entry.info.shape)

  def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of the leading axis, reading only their bytes."""
    entry = self._readable(name)
    shape, dtype = entry.info.shape, entry.info.dtype
    if not shape or not 0 <= start <= stop <= shape[0]:
      raise IndexError(f'{self.path}: tensor {name} of shape {shape} has no '
                       f'rows [{start}, {stop}).')
    row_bytes = dtype.itemsize * math.prod(shape[1:])
    data, _ = _read_bytes(entry.file, entry.offset + start * row_bytes,
                          (stop - start) * row_bytes, name)
    return data.view(dtype).reshape((stop - start,) + shape[1:])


_DIRECTORY_FILES = ('variables/variables.index', 'model.safetensors',
                    'pytorch_model.bin')


def open_tensor_file(path: str | os.PathLike[str]) -> TensorFile:
  """Opens a TF checkpoint prefix (or its `.index`), a `.safetensors` file, a
  PyTorch zip (`.bin`), or a directory holding one of `_DIRECTORY_FILES`
  (the first found): a TF-Hub module or a Hugging Face model."""
  path = os.fspath(path)
  prefix = path.removesuffix('.index')
  if epath.Path(prefix + '.index').exists():
    return _open_tf_bundle(prefix)
  if epath.Path(path).is_dir():
    for name in _DIRECTORY_FILES:
      if (epath.Path(path) / name).exists():
        return open_tensor_file(str(epath.Path(path) / name))
    raise NotFound(f'No tensor file in directory {path}: looked for '
                   f'{", ".join(_DIRECTORY_FILES)}.')
  if not epath.Path(path).exists():
    raise NotFound(
        f'No tensor file at {path}: neither a file nor a TF checkpoint prefix '
        f'(no {prefix}.index).')
  if path.endswith('.safetensors'):
    return _open_safetensors(path)
  return _open_torch_zip(path)


# TensorFlow bundles.

# TensorFlow's DataType enum -> numpy; DT_STRING (7) and the rest are refused.
_TF_DTYPES = {
    1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16,
    6: np.int8, 8: np.complex64, 9: np.int64, 10: np.bool_,
    14: ml_dtypes.bfloat16, 17: np.uint16, 18: np.complex128, 19: np.float16,
    22: np.uint32, 23: np.uint64,
}
_TABLE_MAGIC = 0xdb4775248b80fb57
_FOOTER_BYTES = 48


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
  """The base-128 varint at `pos`, and the position after it."""
  value = shift = 0
  while True:
    if pos >= len(buf):
      raise TensorFileError('truncated varint')
    byte = buf[pos]
    value |= (byte & 0x7f) << shift
    pos += 1
    if byte < 0x80:
      return value, pos
    shift += 7


def _proto_fields(buf: bytes) -> dict[int, list[int | bytes]]:
  """A protobuf message's values by field number: varints and fixed-width
  values as ints, length-delimited ones as bytes."""
  fields = collections.defaultdict(list)
  pos = 0
  while pos < len(buf):
    tag, pos = _varint(buf, pos)
    wire_type = tag & 7
    if wire_type == 0:
      value, pos = _varint(buf, pos)
    elif wire_type == 2:
      size, pos = _varint(buf, pos)
      value, pos = buf[pos:pos + size], pos + size
    elif wire_type in (1, 5):
      width = 8 if wire_type == 1 else 4
      value, pos = int.from_bytes(buf[pos:pos + width], 'little'), pos + width
    else:
      raise TensorFileError(f'unsupported protobuf wire type {wire_type}')
    if pos > len(buf):
      raise TensorFileError('truncated protobuf message')
    fields[tag >> 3].append(value)
  return fields


def _field(fields: dict[int, list[int | bytes]], number: int,
           default: int | bytes = 0) -> int | bytes:
  """A singular field's value: proto3 omits default values."""
  return fields[number][-1] if fields[number] else default


def _block(table: bytes, handle: bytes) -> bytes:
  """The contents of the table block that a BlockHandle points to."""
  offset, pos = _varint(handle, 0)
  size, _ = _varint(handle, pos)
  if offset + size + 5 > len(table):  # A type byte and a CRC follow.
    raise TensorFileError(f'block [{offset}, {offset + size}) runs past the '
                          'end of the file')
  if table[offset + size] != 0:
    raise TensorFileError(
        f'block at {offset} is compressed (type {table[offset + size]}); '
        'TensorFlow writes bundles uncompressed and only those are read')
  return table[offset:offset + size]


def _block_items(block: bytes) -> Iterator[tuple[bytes, bytes]]:
  """A block's key-value pairs; each key shares a prefix with the last one."""
  restarts = int.from_bytes(block[-4:], 'little')
  end = len(block) - 4 * (restarts + 1)
  if end < 0:
    raise TensorFileError('malformed block')
  key, pos = b'', 0
  while pos < end:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    size, pos = _varint(block, pos)
    key = key[:shared] + block[pos:pos + unshared]
    yield key, block[pos + unshared:pos + unshared + size]
    pos += unshared + size


def _table_items(table: bytes) -> Iterator[tuple[bytes, bytes]]:
  """The key-value pairs of a LevelDB-format table, in key order."""
  if (len(table) < _FOOTER_BYTES or
      int.from_bytes(table[-8:], 'little') != _TABLE_MAGIC):
    raise TensorFileError('not a LevelDB-format table (no footer magic)')
  footer = table[-_FOOTER_BYTES:]
  _, pos = _varint(footer, 0)  # Skips the metaindex handle: TF writes no
  _, pos = _varint(footer, pos)  # filters.
  for _, handle in _block_items(_block(table, footer[pos:])):
    yield from _block_items(_block(table, handle))


def _tf_entry(prefix: str, num_shards: int, name: str,
              fields: dict[int, list[int | bytes]]) -> _Entry:
  """A tensor from its BundleEntryProto."""
  dims = _proto_fields(_field(fields, 2, b''))[2]  # TensorShapeProto.dim
  shape = tuple(_field(_proto_fields(dim), 1) for dim in dims)
  shape = tuple(d - (1 << 64) if d >> 63 else d for d in shape)  # int64
  dtype = _TF_DTYPES.get(_field(fields, 1), object)
  info = TensorInfo(name, shape, np.dtype(dtype))
  if fields[7]:
    return _Entry(info, refusal='it is a partitioned variable (saved in '
                  'slices), which is not supported')
  if dtype is object:
    kind = ('DT_STRING' if _field(fields, 1) == 7 else
            f'DataType {_field(fields, 1)}')
    return _Entry(info, refusal=f'{kind} tensors are not supported')
  if _field(fields, 5) != _nbytes(info):
    raise TensorFileError(
        f'tensor {name} has {_field(fields, 5)} bytes, but its shape {shape} '
        f'of {info.dtype} needs {_nbytes(info)}')
  shard = _field(fields, 3)
  if shard >= num_shards:
    raise TensorFileError(f'tensor {name} is in shard {shard} of {num_shards}')
  return _Entry(info, epath.Path(f'{prefix}.data-{shard:05d}-of-'
                                 f'{num_shards:05d}'),
                _field(fields, 4), crc32c=_field(fields, 6))


def _tf_entries(prefix: str, table: bytes) -> dict[str, _Entry]:
  items = dict(_table_items(table))
  if b'' not in items:
    raise TensorFileError('no bundle header (the empty key)')
  header = _proto_fields(items.pop(b''))
  if _field(header, 2) != 0:
    raise TensorFileError('a big-endian bundle; only little-endian is read')
  entries = {}
  for key, value in items.items():
    if key.startswith(b'\0'):  # A slice of a partitioned variable, which is
      continue  # listed (and refused) under its own name.
    entries[key.decode()] = _tf_entry(prefix, _field(header, 1), key.decode(),
                                      _proto_fields(value))
  return entries


def _open_tf_bundle(prefix: str) -> TensorFile:
  index = epath.Path(prefix + '.index')
  try:
    entries = _tf_entries(prefix, index.read_bytes())
  except (ValueError, TypeError) as e:  # Ours, and those of malformed data.
    raise TensorFileError(f'{index}: {e}.') from None
  for shard in sorted({str(e.file) for e in entries.values() if e.file}):
    if not epath.Path(shard).exists():
      raise NotFound(f'{index}: data shard {shard} is missing.')
  return TensorFile(prefix, entries)


# PyTorch zip files.

# torch's storage class prefix and dtype name for each numpy dtype.
_TORCH_TYPES = (
    ('Float', 'float32', np.float32), ('Double', 'float64', np.float64),
    ('Half', 'float16', np.float16),
    ('BFloat16', 'bfloat16', ml_dtypes.bfloat16),
    ('Long', 'int64', np.int64), ('Int', 'int32', np.int32),
    ('Short', 'int16', np.int16), ('Char', 'int8', np.int8),
    ('Byte', 'uint8', np.uint8), ('Bool', 'bool', np.bool_),
)
_TORCH_DTYPES = {name: np.dtype(dtype) for _, name, dtype in _TORCH_TYPES}


@dataclasses.dataclass(frozen=True)
class _Storage:
  key: str  # Its bytes are the member `<root>/data/<key>`.
  dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class _PickledTensor:
  storage: _Storage
  offset: int  # In elements.
  shape: tuple[int, ...]
  stride: tuple[int, ...]


def _rebuild_tensor(storage, offset, shape, stride, *_):
  """Stands in for torch._utils._rebuild_tensor_v2, reading nothing."""
  return _PickledTensor(storage, offset, tuple(shape), tuple(stride))


def _rebuild_parameter(data, *_):
  return data


# The only globals a state dict's pickle may name: all of them just build
# data, so no pickle can run code. Storage types and dtypes become their
# dtype's name, a str, which a pickle can neither call nor modify.
_TORCH_GLOBALS = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
    ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
    **{('torch', f'{storage}Storage'): name
       for storage, name, _ in _TORCH_TYPES},
    **{('torch', name): name for name in _TORCH_DTYPES},
}


class _StateDictUnpickler(pickle.Unpickler):
  """Unpickles `data.pkl` of a state dict, refusing every other global."""

  def __init__(self, file, path: str):
    super().__init__(file)
    self._path = path

  def find_class(self, module: str, name: str):
    if (module, name) not in _TORCH_GLOBALS:
      raise TensorFileError(
          f'{self._path}: refusing to unpickle the global {module}.{name}: '
          'only state dicts of tensors are read.')
    return _TORCH_GLOBALS[module, name]

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and
            pid[0] == 'storage' and isinstance(pid[1], str) and
            pid[1] in _TORCH_DTYPES):
      raise TensorFileError(
          f'{self._path}: unsupported persistent id {pid!r:.100}.')
    return _Storage(str(pid[2]), _TORCH_DTYPES[pid[1]])


def _is_c_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
  expected = 1
  for size, step in zip(reversed(shape), reversed(stride)):
    if size != 1 and step != expected:
      return False
    expected *= size
  return len(shape) == len(stride)


def _member_offset(f, member: zipfile.ZipInfo) -> int:
  """Where a member's bytes start: after its local header, whose extra field
  (torch pads it to align the data) differs from the central directory's."""
  f.seek(member.header_offset)
  header = f.read(30)
  if header[:4] != b'PK\x03\x04':
    raise TensorFileError(f'no local header for {member.filename}')
  name_size, extra_size = struct.unpack('<HH', header[26:30])
  return member.header_offset + 30 + name_size + extra_size


def _torch_entry(path: str, name: str, tensor: _PickledTensor,
                 member: zipfile.ZipInfo, start: int) -> _Entry:
  """A state dict tensor whose storage is `member`, from byte `start`."""
  info = TensorInfo(name, tensor.shape, tensor.storage.dtype)
  if member.compress_type != zipfile.ZIP_STORED:
    return _Entry(info, refusal=f'its storage {member.filename} is compressed')
  if not _is_c_contiguous(tensor.shape, tensor.stride):
    return _Entry(info, refusal=f'it is not contiguous (shape {tensor.shape}, '
                  f'stride {tensor.stride}): save it .contiguous()')
  offset = tensor.offset * info.dtype.itemsize
  if offset + _nbytes(info) > member.file_size:
    raise TensorFileError(f'{path}: tensor {name} runs past the end of its '
                          f'storage {member.filename}.')
  return _Entry(info, epath.Path(path), start + offset)


def _torch_entries(path: str, f) -> dict[str, _Entry]:
  archive = zipfile.ZipFile(f)
  pickles = [n for n in archive.namelist()
             if n.endswith('/data.pkl') and n.count('/') == 1]
  if len(pickles) != 1:
    raise TensorFileError(f'{path}: expected one <root>/data.pkl in the zip, '
                          f'found {pickles}.')
  root = pickles[0].removesuffix('data.pkl')
  if (root + 'byteorder' in archive.namelist() and
      archive.read(root + 'byteorder') != b'little'):
    raise TensorFileError(f'{path}: a big-endian file; only little-endian is '
                          'read.')
  with archive.open(pickles[0]) as pickled:
    state = _StateDictUnpickler(pickled, path).load()
  if not isinstance(state, dict):
    raise TensorFileError(f'{path} holds a {type(state).__name__}, not a '
                          'state dict.')
  members = {m.filename: m for m in archive.infolist()}
  starts = {n: _member_offset(f, m) for n, m in members.items()
            if n.startswith(root + 'data/') and
            m.compress_type == zipfile.ZIP_STORED}
  entries = {}
  for name, tensor in state.items():
    if not isinstance(tensor, _PickledTensor):
      raise TensorFileError(f'{path}: {name!r} is a {type(tensor).__name__}, '
                            'not a tensor: only flat state dicts are read.')
    member = f'{root}data/{tensor.storage.key}'
    if member not in members:
      raise TensorFileError(f'{path}: tensor {name} has no storage {member}.')
    entries[name] = _torch_entry(path, name, tensor, members[member],
                                 starts.get(member, 0))
  return entries


def _open_torch_zip(path: str) -> TensorFile:
  with epath.Path(path).open('rb') as f:
    magic = f.read(4)
    if magic != b'PK\x03\x04':
      kind = ('a legacy (non-zip) torch.save file: re-save it with torch>=1.6'
              if magic[:1] == b'\x80' else
              'not a PyTorch zip, a .safetensors file or a TF checkpoint')
      raise TensorFileError(f'{path} is {kind}.')
    try:
      return TensorFile(path, _torch_entries(path, f))
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, TypeError,
            AttributeError) as e:
      raise TensorFileError(f'{path}: a corrupt PyTorch zip: {e}') from None


# safetensors.

_SAFETENSORS_DTYPES = {
    'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
    'BF16': ml_dtypes.bfloat16, 'F8_E4M3': ml_dtypes.float8_e4m3fn,
    'F8_E5M2': ml_dtypes.float8_e5m2, 'I64': np.int64, 'I32': np.int32,
    'I16': np.int16, 'I8': np.int8, 'U64': np.uint64, 'U32': np.uint32,
    'U16': np.uint16, 'U8': np.uint8, 'BOOL': np.bool_,
}
_MAX_SAFETENSORS_HEADER = 100 << 20  # The format's own limit.


def _open_safetensors(path: str) -> TensorFile:
  """Parses the header itself, so that gs:// files need no download."""
  with epath.Path(path).open('rb') as f:
    size = int.from_bytes(f.read(8), 'little')
    header = f.read(size) if size <= _MAX_SAFETENSORS_HEADER else b''
  entries = {}
  try:
    if len(header) != size:
      raise ValueError('truncated or not a safetensors file')
    for name, spec in json.loads(header).items():
      if name == '__metadata__':
        continue
      shape = tuple(int(d) for d in spec['shape'])
      dtype = _SAFETENSORS_DTYPES.get(spec['dtype'], object)
      info = TensorInfo(name, shape, np.dtype(dtype))
      if dtype is object:
        entries[name] = _Entry(info, refusal=f'dtype {spec["dtype"]} is not '
                               'supported')
        continue
      begin, end = spec['data_offsets']
      if end - begin != _nbytes(info):
        raise ValueError(f'tensor {name} has {end - begin} bytes, but its '
                         f'shape {shape} of {info.dtype} needs {_nbytes(info)}')
      entries[name] = _Entry(info, epath.Path(path), 8 + size + begin)
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise TensorFileError(f'{path}: bad safetensors header: {e}.') from None
  return TensorFile(path, entries)
