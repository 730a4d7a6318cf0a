"""A run's parameters as the tensors of Hugging Face's files, and back.

Each weight is a `pretrained.Tensor`: its place in our parameter tree and
its name in a PyTorch state dict. The same tables read BERT weights in
(`pretrained`, `released`); here they also write them out, kernels
transposed to PyTorch's [out, in] and each BERT's layers unrolled
(`encoder.layer.N`), so that the two directions cannot drift apart.
"""

import dataclasses

import numpy as np

from realm_jax.models import bert, pretrained
from realm_jax.models.bert import BertConfig
from realm_jax.models.pretrained import Tensor

# BertForMaskedLM's prefixes: the encoder and BERT's masked-LM head.
MASKED_LM_BERT = 'bert.'
MASKED_LM_HEAD = 'cls.predictions.'


def unrolled(config: BertConfig, add_pooler: bool = False) -> BertConfig:
  """`config` with its layers one tensor each, as the files hold them."""
  return dataclasses.replace(config, scan_layers=False,
                             add_pooler=config.add_pooler or add_pooler)


def _node(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def to_source(tensor: Tensor, value) -> np.ndarray:
  """Our parameter as PyTorch stores it: the inverse of
  `Tensor.from_source` for a file with transposed kernels."""
  value = np.asarray(value, np.float32).reshape(tensor.source_shape)
  return value.T.copy() if tensor.in_ndim is not None else value


def to_hf(tensors, tree: dict, prefix: str = '') -> dict[str, np.ndarray]:
  """{name: array} of `tensors`, each read from `tree`."""
  return {prefix + t.hf_name: to_source(t, _node(tree, t.path))
          for t in tensors}


def from_hf(tensors, arrays: dict, prefix: str = '') -> dict:
  """The nested parameters of `tensors` from {name: array} (float32)."""
  return pretrained.assemble(tensors, lambda name: arrays[prefix + name],
                             True, np.float32)


def bert_to_hf(params: dict, config: BertConfig, prefix: str = '',
               add_pooler: bool = False) -> dict[str, np.ndarray]:
  """A BERT's parameters (either layer layout) as BertModel's tensors."""
  flat = unrolled(config, add_pooler)
  return to_hf(pretrained.bert_tensors(flat), bert.in_layout(params, flat),
               prefix)


def bert_from_hf(arrays: dict, config: BertConfig, prefix: str = '',
                 add_pooler: bool = False) -> dict:
  """BertModel's tensors as a BERT's parameters in `config`'s layout."""
  flat = unrolled(config, add_pooler)
  params = from_hf(pretrained.bert_tensors(flat), arrays, prefix)
  return bert.in_layout(params, dataclasses.replace(
      config, add_pooler=config.add_pooler or add_pooler))


def masked_lm_head_tensors(config: BertConfig) -> list[Tensor]:
  """BERT's masked-LM head (`reader.MaskedLMHead`); its decoder is the
  word embeddings, tied, so no tensor of its own."""
  h = config.hidden_size
  transform = MASKED_LM_HEAD + 'transform.'
  return [
      *pretrained.dense_tensors(('transform',), transform + 'dense',
                                transform + 'dense', (h, h)),
      *pretrained.layer_norm_tensors(('transform_layer_norm',),
                                     transform + 'LayerNorm',
                                     transform + 'LayerNorm', h),
      Tensor(('output_bias',), (config.vocab_size,), MASKED_LM_HEAD + 'bias',
             MASKED_LM_HEAD + 'bias')]


def span_head_tensors(hidden: int, projection: int) -> list[Tensor]:
  """ORQA's span scorer (`reader.SpanReaderHead`), named by its place in
  our tree: start and end projections, their LayerNorm, the score."""
  named = lambda path: '.'.join(path)
  tensors = []
  for path, shape in ((('start',), (hidden, projection)),
                      (('end',), (hidden, projection)),
                      (('score',), (projection, 1))):
    tensors += pretrained.dense_tensors(path, named(path), named(path), shape)
  tensors += pretrained.layer_norm_tensors(('layer_norm',), 'layer_norm',
                                           'layer_norm', projection)
  return tensors


def config_json(config: BertConfig, architecture: str) -> dict:
  """Hugging Face's config.json of a BERT with `config`'s architecture."""
  fields = {theirs: getattr(config, ours)
            for theirs, ours in pretrained.HF_FIELDS.items()}
  return {'architectures': [architecture], 'model_type': 'bert',
          **fields, 'pad_token_id': 0, 'tie_word_embeddings': True,
          'torch_dtype': 'float32'}
