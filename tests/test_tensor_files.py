"""The released-checkpoint readers against the frameworks that wrote the
files: TensorFlow bundles, PyTorch zips and safetensors, each compared with
its own framework's loader, read locally and from a gs://-like filesystem."""

import collections
import os
import pickle
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
from etils import epath

from realm_jax.released.tensor_files import TensorFileError, open_tensor_file

# Enough long shared-prefix names that the index spans several 4 KB blocks.
LAYERS = [f'bert/encoder/layer_{i:03d}/attention/self/query/kernel'
          for i in range(300)]


def _save_v2(prefix, tensors, slices=None):
  tf = pytest.importorskip('tensorflow')
  names = list(tensors)
  tf.raw_ops.SaveV2(
      prefix=str(prefix), tensor_names=names,
      shape_and_slices=slices or [''] * len(names),
      tensors=[tf.constant(v) for v in tensors.values()])
  return str(prefix)


@pytest.fixture(scope='module')
def tf_checkpoint(tmp_path_factory):
  rng = np.random.default_rng(0)
  tensors = {
      'module/module/dense/kernel':
          rng.standard_normal((1000, 16)).astype(np.float32),
      'module/module/dense/bias': rng.standard_normal(16).astype(np.float32),
      'global_step': np.int64(123456789012),
      'module/bf16': rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
      'module/half': rng.standard_normal(7).astype(np.float16),
      'module/mask': np.array([True, False, True]),
      'module/ids': np.arange(-4, 4, dtype=np.int32),
      'module/empty': np.zeros((0, 4), np.float32),
      'vocab': np.array([b'[CLS]', b'the']),
      **{name: rng.standard_normal((2, 3)).astype(np.float32)
         for name in LAYERS},
  }
  return _save_v2(tmp_path_factory.mktemp('tf') / 'model.ckpt', tensors)


@pytest.mark.unit
def test_a_tf_bundle_reads_like_tensorflow(tf_checkpoint):
  tf = pytest.importorskip('tensorflow')
  assert os.path.getsize(tf_checkpoint + '.index') > 3 * 4096
  reader = tf.train.load_checkpoint(tf_checkpoint)
  dtypes = reader.get_variable_to_dtype_map()
  infos = open_tensor_file(tf_checkpoint).infos()
  assert set(infos) == set(dtypes)
  checkpoint = open_tensor_file(tf_checkpoint + '.index')
  for name, info in infos.items():
    assert info.name == name
    assert info.shape == tuple(reader.get_variable_to_shape_map()[name])
    if name == 'vocab':
      assert info.dtype == np.dtype(object)
      with pytest.raises(TensorFileError, match='cannot read tensor vocab: '
                         'DT_STRING'):
        checkpoint.read(name)
      continue
    assert info.dtype == np.dtype(dtypes[name].as_numpy_dtype)
    array = checkpoint.read(name)
    expected = reader.get_tensor(name)
    assert array.dtype == info.dtype and array.shape == info.shape
    np.testing.assert_array_equal(array, expected, strict=True)
    assert array.flags.writeable and array.flags.c_contiguous


@pytest.mark.unit
def test_read_rows_reads_a_slice_of_the_leading_axis(tf_checkpoint):
  checkpoint = open_tensor_file(tf_checkpoint)
  kernel = checkpoint.read('module/module/dense/kernel')
  for start, stop in ((0, 1000), (100, 250), (999, 1000), (5, 5)):
    np.testing.assert_array_equal(
        checkpoint.read_rows('module/module/dense/kernel', start, stop),
        kernel[start:stop], strict=True)
  np.testing.assert_array_equal(checkpoint.read_rows('module/bf16', 1, 3),
                                checkpoint.read('module/bf16')[1:3],
                                strict=True)
  for start, stop in ((-1, 5), (5, 4), (0, 1001)):
    with pytest.raises(IndexError, match=r'dense/kernel of shape \(1000, 16\)'):
      checkpoint.read_rows('module/module/dense/kernel', start, stop)
  with pytest.raises(IndexError, match='global_step'):
    checkpoint.read_rows('global_step', 0, 1)
  with pytest.raises(KeyError, match='no tensor'):
    checkpoint.read('module/missing')


@pytest.mark.unit
def test_a_tf2_checkpoint_and_a_hub_module_layout(tmp_path):
  tf = pytest.importorskip('tensorflow')
  prefix = tf.train.Checkpoint(
      step=tf.Variable(7, dtype=tf.int64),
      emb=tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3)),
  ).write(str(tmp_path / 'hub' / 'variables' / 'variables'))
  reader = tf.train.load_checkpoint(prefix)
  checkpoint = open_tensor_file(tmp_path / 'hub')
  assert checkpoint.path == prefix
  strings = {n for n, info in checkpoint.infos().items()
             if info.dtype == np.dtype(object)}
  assert strings == {'_CHECKPOINTABLE_OBJECT_GRAPH'}
  for name in set(checkpoint.infos()) - strings:
    np.testing.assert_array_equal(checkpoint.read(name),
                                  reader.get_tensor(name), strict=True)


@pytest.mark.unit
def test_tf_checksums_are_checked(tmp_path):
  prefix = _save_v2(tmp_path / 'ckpt', {'w': np.arange(64, dtype=np.float32)})
  np.testing.assert_array_equal(open_tensor_file(prefix).read('w'),
                                np.arange(64, dtype=np.float32))
  data = epath.Path(prefix + '.data-00000-of-00001')
  corrupt = bytearray(data.read_bytes())
  corrupt[1] ^= 1  # In w[0].
  data.write_bytes(bytes(corrupt))
  with pytest.raises(TensorFileError, match='tensor w fails its CRC32C'):
    open_tensor_file(prefix).read('w')


@pytest.mark.unit
def test_a_partitioned_tf_variable_is_listed_and_refused(tmp_path):
  prefix = _save_v2(tmp_path / 'ckpt', {
      'part': np.ones((2, 2), np.float32), 'whole': np.ones(2, np.float32)},
                    slices=['4 2 0,2:-', ''])
  checkpoint = open_tensor_file(prefix)
  assert checkpoint.infos()['part'].shape == (4, 2)
  assert set(checkpoint.infos()) == {'part', 'whole'}
  with pytest.raises(TensorFileError, match='tensor part: it is a partitioned'):
    checkpoint.read('part')


@pytest.mark.unit
def test_a_truncated_tf_data_file_is_refused_naming_the_tensor(tf_checkpoint,
                                                               tmp_path):
  for suffix in ('.index', '.data-00000-of-00001'):
    data = epath.Path(tf_checkpoint + suffix).read_bytes()
    (tmp_path / ('ckpt' + suffix)).write_bytes(data)
  data_file = tmp_path / 'ckpt.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:100])
  with pytest.raises(TensorFileError, match=f'{data_file} is truncated: '
                     'tensor module/module/dense/kernel needs'):
    open_tensor_file(tmp_path / 'ckpt').read('module/module/dense/kernel')
  data_file.unlink()
  with pytest.raises(FileNotFoundError, match='data shard .* is missing'):
    open_tensor_file(tmp_path / 'ckpt')


@pytest.mark.unit
def test_a_bad_tf_index_is_refused(tmp_path):
  (tmp_path / 'ckpt.index').write_bytes(b'\0' * 100)
  with pytest.raises(TensorFileError, match='ckpt.index: not a LevelDB'):
    open_tensor_file(tmp_path / 'ckpt')


def _torch_state_dict():
  torch = pytest.importorskip('torch')
  big = torch.arange(1000 * 16, dtype=torch.float32).reshape(1000, 16)
  return torch, collections.OrderedDict(
      big=big,
      view=big[10:20],  # Shares big's storage, from element 160.
      transposed=big[:8, :4].t(),
      half=torch.linspace(-1, 1, 7, dtype=torch.float16),
      bf16=torch.linspace(-1, 1, 6, dtype=torch.bfloat16).reshape(2, 3),
      ids=torch.arange(-3, 3, dtype=torch.int64),
      mask=torch.tensor([True, False]),
      scalar=torch.tensor(2.5),
      weight=torch.nn.Parameter(torch.ones(3, 2)),
  )


def _numpy(tensor):
  torch = sys.modules['torch']
  if tensor.dtype == torch.bfloat16:
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.detach().numpy()


@pytest.mark.unit
def test_a_pytorch_zip_reads_like_torch_load(tmp_path):
  torch, state = _torch_state_dict()
  torch.save(state, tmp_path / 'pytorch_model.bin')
  loaded = torch.load(tmp_path / 'pytorch_model.bin')
  checkpoint = open_tensor_file(tmp_path)
  assert list(checkpoint.infos()) == list(state)
  for name, info in checkpoint.infos().items():
    expected = _numpy(loaded[name])
    assert (info.shape, info.dtype) == (expected.shape, expected.dtype)
    if name == 'transposed':
      with pytest.raises(TensorFileError,
                         match='tensor transposed: it is not contiguous'):
        checkpoint.read(name)
      continue
    np.testing.assert_array_equal(checkpoint.read(name), expected, strict=True)
  np.testing.assert_array_equal(checkpoint.read_rows('big', 100, 250),
                                _numpy(state['big'][100:250]), strict=True)
  np.testing.assert_array_equal(checkpoint.read_rows('view', 3, 10),
                                _numpy(state['big'][13:20]), strict=True)


@pytest.mark.unit
def test_storage_typed_by_a_dtype_and_unaligned_members(tmp_path):
  torch, state = _torch_state_dict()
  torch.save({'half': state['half']}, tmp_path / 'saved.bin')
  # Re-zipped without torch's alignment padding, with the storage named by
  # its dtype as newer TypedStorage pickles may.
  with zipfile.ZipFile(tmp_path / 'saved.bin') as source, zipfile.ZipFile(
      tmp_path / 'typed.bin', 'w') as target:
    for member in source.namelist():
      data = source.read(member)
      if member.endswith('data.pkl'):
        assert b'torch\nHalfStorage\n' in data
        data = data.replace(b'torch\nHalfStorage\n', b'torch\nfloat16\n')
      target.writestr(member, data)
  np.testing.assert_array_equal(
      open_tensor_file(tmp_path / 'typed.bin').read('half'),
      _numpy(state['half']), strict=True)


@pytest.mark.unit
def test_compressed_storage_is_refused_naming_the_tensor(tmp_path):
  torch, state = _torch_state_dict()
  torch.save({'big': state['big']}, tmp_path / 'stored.bin')
  with zipfile.ZipFile(tmp_path / 'stored.bin') as source, zipfile.ZipFile(
      tmp_path / 'deflated.bin', 'w', zipfile.ZIP_DEFLATED) as target:
    for member in source.namelist():
      target.writestr(member, source.read(member))
  checkpoint = open_tensor_file(tmp_path / 'deflated.bin')
  assert checkpoint.infos()['big'].shape == (1000, 16)
  with pytest.raises(TensorFileError, match='tensor big: its storage .* is '
                     'compressed'):
    checkpoint.read('big')


class _Exploit:

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return os.system, (f'touch {self.marker}',)


@pytest.mark.unit
def test_a_pickle_naming_another_global_is_refused(tmp_path):
  marker = tmp_path / 'pwned'
  with zipfile.ZipFile(tmp_path / 'evil.bin', 'w') as archive:
    archive.writestr('archive/data.pkl', pickle.dumps(
        collections.OrderedDict(x=_Exploit(marker)), protocol=2))
    archive.writestr('archive/version', '3\n')
  with pytest.raises(TensorFileError,
                     match=r'evil.bin: refusing to unpickle the global '
                     r'(posix|os)\.system'):
    open_tensor_file(tmp_path / 'evil.bin')
  assert not marker.exists()


@pytest.mark.unit
def test_a_legacy_torch_file_is_refused(tmp_path):
  torch, state = _torch_state_dict()
  torch.save({'ids': state['ids']}, tmp_path / 'old.bin',
             _use_new_zipfile_serialization=False)
  with pytest.raises(TensorFileError, match='old.bin is a legacy'):
    open_tensor_file(tmp_path / 'old.bin')
  (tmp_path / 'notes.txt').write_text('hello')
  with pytest.raises(TensorFileError, match='notes.txt is not a PyTorch zip'):
    open_tensor_file(tmp_path / 'notes.txt')


def _safetensors(tmp_path):
  safetensors_numpy = pytest.importorskip('safetensors.numpy')
  rng = np.random.default_rng(1)
  tensors = {
      'embeddings.weight': rng.standard_normal((1000, 16)).astype(np.float32),
      'half': rng.standard_normal(5).astype(np.float16),
      'ids': np.arange(6, dtype=np.int64).reshape(2, 3),
      'mask': np.array([True, False]),
      'scalar': np.array(3.5, np.float64),
  }
  path = tmp_path / 'model.safetensors'
  safetensors_numpy.save_file(tensors, str(path), metadata={'format': 'np'})
  return path, tensors


@pytest.mark.unit
def test_safetensors_read_like_safetensors(tmp_path):
  path, tensors = _safetensors(tmp_path)
  expected = sys.modules['safetensors.numpy'].load_file(str(path))
  checkpoint = open_tensor_file(tmp_path)
  assert checkpoint.path == str(path)
  assert set(checkpoint.infos()) == set(tensors)
  for name, info in checkpoint.infos().items():
    assert (info.shape, info.dtype) == (tensors[name].shape,
                                        tensors[name].dtype)
    np.testing.assert_array_equal(checkpoint.read(name), expected[name],
                                  strict=True)
  np.testing.assert_array_equal(
      checkpoint.read_rows('embeddings.weight', 10, 20),
      tensors['embeddings.weight'][10:20], strict=True)
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(TensorFileError,
                     match='is truncated: tensor embeddings.weight needs'):
    open_tensor_file(path).read('embeddings.weight')
  path.write_bytes(b'\xff' * 16)
  with pytest.raises(TensorFileError, match='bad safetensors header'):
    open_tensor_file(path)


@pytest.mark.unit
def test_missing_files_are_named_with_what_was_looked_for(tmp_path):
  with pytest.raises(FileNotFoundError,
                     match=f'No tensor file at {tmp_path}/nothing: .*'
                     f'no {tmp_path}/nothing.index'):
    open_tensor_file(tmp_path / 'nothing')
  with pytest.raises(FileNotFoundError, match='No tensor file at .*.bin'):
    open_tensor_file(tmp_path / 'pytorch_model.bin')
  with pytest.raises(FileNotFoundError,
                     match=f'No tensor file in directory {tmp_path}: looked '
                     'for variables/variables.index, model.safetensors, '
                     'pytorch_model.bin'):
    open_tensor_file(tmp_path)


@pytest.mark.unit
def test_every_format_reads_from_a_remote_filesystem(ram, tmp_path,
                                                     tf_checkpoint):
  torch, state = _torch_state_dict()
  torch.save(state, tmp_path / 'pytorch_model.bin')
  _safetensors(tmp_path)
  local = os.path.dirname(tf_checkpoint)
  for directory, names in ((local, os.listdir(local)),
                           (str(tmp_path), ['pytorch_model.bin',
                                            'model.safetensors'])):
    for name in names:
      ram.joinpath(name).write_bytes(epath.Path(directory, name).read_bytes())
  for name in ('model.ckpt', 'pytorch_model.bin', 'model.safetensors'):
    source = tf_checkpoint if name == 'model.ckpt' else str(tmp_path / name)
    remote = open_tensor_file(str(ram / name))
    expected = open_tensor_file(source)
    assert remote.infos() == expected.infos()
    for tensor, info in remote.infos().items():
      try:
        array = expected.read(tensor)
      except TensorFileError:  # Strings, views: refused either way.
        continue
      np.testing.assert_array_equal(remote.read(tensor), array, strict=True)
      if info.shape:
        half = info.shape[0] // 2
        np.testing.assert_array_equal(
            remote.read_rows(tensor, half, info.shape[0]), array[half:],
            strict=True)


@pytest.mark.integration  # A subprocess.
def test_importing_the_readers_imports_no_framework():
  subprocess.run([
      sys.executable, '-c',
      'import sys, realm_jax.released.tensor_files; '
      "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules"
  ], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
