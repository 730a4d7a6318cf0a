"""BERT in Flax Linen, the transformer under every REALM tower.

Post-LN BERT (Devlin et al. 2019) with logical axis names on every parameter and
activation, so one table of rules (training/partitioning) decides the sharding.
Parameters stay a plain pytree once unboxed: Orbax saves it and the index
builder can load the document tower by sub-tree.

The layers run under `nn.scan` (`BertConfig.scan_layers`): XLA compiles one
layer body per sequence shape instead of one per layer, and the parameters of
all layers are stacked on a leading axis, logical name 'layers', under the
single key 'layers' (`stack_layers` turns the unrolled layout, `layer_0`,
`layer_1`, ..., into that one; `unstack_layers` back).
"""

import dataclasses
import functools
import math
import re
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from realm_jax.models import target
from realm_jax.models.attention import attend
from realm_jax.models.products import contract


def exact_gelu(x):
  """GELU's exact form, x Phi(x), written with erf as PyTorch's and the
  original BERT's are, in float32 whatever the input's dtype (in bfloat16,
  1 + erf would round the tail below about -2 to 0). JAX's own
  (`jax.nn.gelu`) writes it with erfc, which XLA:GPU computes in two
  passes over the feed-forward width instead of one: a fifth of the bytes
  BERT-base's embedding step moves (docs/benchmarks.md). On a TPU it is
  JAX's: XLA:TPU fuses erf's float32 polynomial into the product before
  it and runs out of vector memory (the paper-scale step on a v4)."""
  if target.target_platform() == 'tpu':
    return jax.nn.gelu(x, approximate=False)
  x32 = x.astype(jnp.float32)
  return (0.5 * x32 * (1 + jax.lax.erf(x32 * np.float32(np.sqrt(0.5))))
          ).astype(x.dtype)


ACTIVATIONS = {
    'gelu': exact_gelu,
    'gelu_new': functools.partial(nn.gelu, approximate=True),
}


def _dtype(value) -> jnp.dtype:
  """Accepts 'bfloat16', jnp.bfloat16 or a numpy dtype (gin passes strings)."""
  return jnp.dtype(value)


# BertConfig.remat -> what a layer saves for the backward pass (None: nothing
# but its input); 'none' is no rematerialization at all.
REMAT_POLICIES = {
    'none': None,
    'full': None,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# The stacked layers' key in a scanned Bert's parameters, and the logical
# name of their leading axis.
LAYERS = 'layers'


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture of one BERT; names follow the BERT paper, defaults BERT-base.

  Attributes:
    vocab_size: WordPiece vocabulary size (30,522 for the uncased vocab).
    hidden_size: width of the residual stream (H).
    num_layers: transformer layers (L).
    num_heads: attention heads (A); hidden_size must divide by it.
    intermediate_size: width of the feed-forward layer (4H in BERT).
    max_position_embeddings: longest sequence the position table covers.
    type_vocab_size: token types (segment A / segment B).
    layer_norm_eps: LayerNorm epsilon (1e-12 in BERT).
    dropout_rate: dropout on embeddings and on each residual branch.
    attention_dropout_rate: dropout on attention probabilities.
    initializer_range: stddev of the truncated-normal initializer.
    dtype: compute dtype of matmuls and activations: 'bfloat16' under the
      mixed-precision policy (gin/setups/bf16.gin, the accelerators'
      default). Products accumulate in float32, and logits, softmaxes,
      LayerNorm statistics and the retrieval embeddings stay float32.
    param_dtype: parameter dtype (float32 keeps the optimizer exact).
    remat: what each layer keeps for the backward pass (`REMAT_POLICIES`):
      'none' keeps every activation but what the LayerNorms and the
      activation function compute (always recomputed from their inputs:
      `layer_norm`, `Dense.input_activation`); 'full' keeps only the layer's input and
      recomputes the rest (the least memory); 'dots' keeps the outputs of the
      matmuls without batch dimensions (the projections and the feed-forward
      layer; attention scores and elementwise ops are recomputed). True and
      False (older configs) mean 'full' and 'none'.
    scan_layers: run the layers under `nn.scan`, their parameters stacked
      under 'layers' (one compiled layer body); False: a Python loop over
      `layer_0` ... `layer_{L-1}` (one compiled copy per layer).
    scan_unroll: layers per trip of the scan's loop (`unroll` of `nn.scan`);
      num_layers runs no loop at all yet keeps the stacked layout: on GPUs
      the loop's carried and stacked buffers cost copies every trip
      (docs/benchmarks.md), at the price of compiling every layer.
    add_pooler: add BERT's tanh pooler over [CLS] (the released REALM towers
      project its output; our own towers project the raw [CLS]).
    hidden_act: 'gelu' (exact, erf) or 'gelu_new' (the tanh approximation of
      Google's original BERT code, which the released REALM models use).
    attention_chunk: sequences XLA's attention takes at a time on CPU
      (models/attention.py); None: 2 in CPU forward passes, all at once
      in training and elsewhere.
    attention_implementation: 'xla', 'cudnn' (GPUs) or 'splash' (TPUs), or
      None: the target's fused kernel, unless attention dropout is active
      (the fused kernels drop no probabilities), else XLA's form.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  dtype: Any = 'float32'
  param_dtype: Any = 'float32'
  remat: str = 'none'
  scan_layers: bool = True
  scan_unroll: int = 1
  add_pooler: bool = False
  hidden_act: str = 'gelu'
  attention_chunk: int | None = None
  attention_implementation: str | None = None

  def __post_init__(self):
    object.__setattr__(self, 'dtype', _dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', _dtype(self.param_dtype))
    if isinstance(self.remat, bool):
      object.__setattr__(self, 'remat', 'full' if self.remat else 'none')
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f'BertConfig.remat={self.remat!r}; expected one of '
                       f'{tuple(REMAT_POLICIES)}.')
    if isinstance(self.scan_unroll, bool) or not (
        isinstance(self.scan_unroll, int) and self.scan_unroll >= 1):
      raise ValueError(f'BertConfig.scan_unroll={self.scan_unroll!r}; '
                       'expected a whole number of layers, at least 1.')
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f'BertConfig.hidden_act={self.hidden_act!r}; expected '
                       f'one of {tuple(ACTIVATIONS)}.')
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f'BertConfig.hidden_size={self.hidden_size} is not divisible by '
          f'BertConfig.num_heads={self.num_heads}.')

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def activation(self, x):
    """The masked-LM transform's nonlinearity, recomputed in the backward
    pass from its input (the product before it), so that autodiff keeps
    that input, not also the GELU's intermediates. The layers' feed-forward
    applies it inside its second product (`Dense.input_activation`), which
    recomputes its output too."""
    return jax.checkpoint(ACTIVATIONS[self.hidden_act],
                          prevent_cse=False)(x)


def _init(config: BertConfig, names: tuple[str, ...]):
  """BERT's truncated-normal initializer, annotated with logical axis names."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), names)


# A LayerNorm recomputed in the backward pass from its input. Autodiff would
# keep three float32 copies of its input's size (the centred input, the
# normalized one, the scaled inverse deviation broadcast), which under the
# layers' scan are stacked per layer: half a bfloat16 step's temporaries.
# Recomputed, only the input is kept. Where the layers are unrolled, XLA
# merges the recomputation with the forward pass and nothing changes.
_RecomputedLayerNorm = nn.remat(nn.LayerNorm, prevent_cse=False)


def layer_norm(config: BertConfig, name: str, axis_name: str = 'embed',
               epsilon: float | None = None, dtype=None):
  """LayerNorm over the last axis, whose logical name is `axis_name`;
  `epsilon` defaults to the config's. Its statistics are float32; it returns
  `dtype` (default the compute dtype). The backward pass recomputes it from
  its input (`_RecomputedLayerNorm`)."""
  return _RecomputedLayerNorm(
      epsilon=config.layer_norm_eps if epsilon is None else epsilon,
      dtype=dtype or config.dtype,
      param_dtype=config.param_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                              (axis_name,)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                             (axis_name,)),
      name=name)


class Dense(nn.Module):
  """x . kernel + bias over the last `in_axes` axes of x, to `features`.

  Unlike nn.DenseGeneral it creates the kernel in its true shape, so the
  logical axis names fit it even when initialized inside a mesh context.
  The product is the compute dtype's (`contract`); the bias is added in
  float32, so its gradient sums over tokens in float32, and the sum is
  returned as `dtype` (default the compute dtype; float32 for scores a
  softmax reads, whose product then returns float32 too). A forward-only
  GPU program adds it where cuBLAS's epilogue can (`target.bias_in_epilogue`).
  `input_activation`: the config's activation applied to x first, its
  output recomputed in the backward pass (`_activated`).
  """
  config: BertConfig
  features: tuple[int, ...]
  kernel_names: tuple[str, ...]
  in_axes: int = 1
  dtype: Any = None
  input_activation: bool = False

  @nn.compact
  def __call__(self, x):
    c = self.config
    kernel = self.param('kernel', _init(c, self.kernel_names),
                        x.shape[-self.in_axes:] + self.features,
                        c.param_dtype)
    bias = self.param('bias', nn.with_logical_partitioning(
        nn.initializers.zeros, self.kernel_names[self.in_axes:]),
                      self.features, c.param_dtype)
    inputs, outputs = 'abcd'[:self.in_axes], 'wxyz'[:len(self.features)]
    dtype = jnp.dtype(self.dtype or c.dtype)
    result = jnp.float32 if dtype == jnp.float32 else None
    epilogue = target.bias_in_epilogue()
    if epilogue:
      width = math.prod(self.features)
      spec = f'...{inputs},{inputs}w->...w'
      kernel = kernel.reshape(kernel.shape[:self.in_axes] + (width,))
    else:
      spec = f'...{inputs},{inputs}{outputs}->...{outputs}'
    product = functools.partial(contract, spec, dtype=c.dtype, result=result)
    if self.input_activation:
      product = _activated(product, ACTIVATIONS[c.hidden_act])
    y = product(x, kernel)
    if epilogue:
      y = y + bias.reshape(width).astype(y.dtype)
      return y.reshape(y.shape[:-1] + self.features).astype(dtype)
    return (y + bias).astype(dtype)


def _activated(product, activation):
  """product(activation(x), kernel), with the activation's output
  recomputed in the backward pass from x rather than kept: the kernel's
  gradient reads it, and autodiff would keep it beside x, a second tensor
  of the feed-forward width per layer that the layers' scan stacks. The
  recomputed product itself is unused, and dropped."""
  return jax.checkpoint(lambda x, kernel: product(activation(x), kernel),
                        prevent_cse=False)


def dense(config: BertConfig, features, kernel_names: tuple[str, ...],
          name: str, in_axes: int = 1, dtype=None,
          input_activation: bool = False) -> Dense:
  """BERT-initialized dense layer; the bias takes the output axis names;
  `input_activation`: the config's activation applied to its input first
  (`_activated`)."""
  features = tuple(features) if isinstance(features, (tuple, list)) else (
      features,)
  return Dense(config, features, kernel_names, in_axes, dtype,
               input_activation, name=name)


class Embeddings(nn.Module):
  """Sum of word, position and token-type embeddings, then LayerNorm.

  The rows are looked up and summed in the parameters' dtype and the
  LayerNorm casts to the compute dtype: the gradient's scatter-adds into the
  tables then accumulate in float32.
  """
  config: BertConfig

  def setup(self):
    c = self.config
    embed = functools.partial(
        nn.Embed, features=c.hidden_size, dtype=c.param_dtype,
        param_dtype=c.param_dtype)
    self.word_embeddings = embed(
        c.vocab_size, embedding_init=_init(c, ('vocab', 'embed')))
    self.position_embeddings = embed(
        c.max_position_embeddings, embedding_init=_init(c, ('length', 'embed')))
    self.token_type_embeddings = embed(
        c.type_vocab_size, embedding_init=_init(c, ('token_type', 'embed')))
    self.layer_norm = layer_norm(c, 'layer_norm')
    self.dropout = nn.Dropout(c.dropout_rate)

  def __call__(self, token_ids, token_type_ids, deterministic: bool):
    length = token_ids.shape[-1]
    if length > self.config.max_position_embeddings:
      raise ValueError(
          f'Sequence length {length} exceeds BertConfig.max_position_embeddings'
          f'={self.config.max_position_embeddings}.')
    x = (self.word_embeddings(token_ids)
         + self.position_embeddings(jnp.arange(length))
         + self.token_type_embeddings(token_type_ids))
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

  def attend(self, hidden):
    """float32 vocabulary logits, the word embeddings the (tied) decoder."""
    return contract('...h,vh->...v', hidden, self.word_embeddings.embedding,
                    self.config.dtype, jnp.float32)


class SelfAttention(nn.Module):
  """Multi-head scaled dot-product self-attention over unpadded keys."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool):
    c = self.config
    project = functools.partial(dense, c, (c.num_heads, c.head_dim),
                                ('embed', 'heads', 'kv'))
    activation_names = ('batch', 'length', 'heads', 'kv')
    query = nn.with_logical_constraint(project('query')(x), activation_names)
    key = nn.with_logical_constraint(project('key')(x), activation_names)
    value = nn.with_logical_constraint(project('value')(x), activation_names)

    dropout = None
    if not deterministic and c.attention_dropout_rate:
      dropout = functools.partial(nn.Dropout(c.attention_dropout_rate),
                                  deterministic=False)
    context = attend(query, key, value, input_mask, c.dtype, dropout,
                     c.attention_chunk, c.attention_implementation,
                     training=not deterministic)
    context = nn.with_logical_constraint(context, activation_names)
    out = dense(c, c.hidden_size, ('heads', 'kv', 'embed'), 'out',
                in_axes=2)(context)
    return nn.with_logical_constraint(out, ('batch', 'length', 'embed'))


class TransformerLayer(nn.Module):
  """Post-LN layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool):
    c = self.config
    dropout = nn.Dropout(c.dropout_rate)
    attended = SelfAttention(c, name='attention')(x, input_mask, deterministic)
    x = layer_norm(c, 'attention_layer_norm')(
        x + dropout(attended, deterministic))

    h = dense(c, c.intermediate_size, ('embed', 'mlp'), 'intermediate')(x)
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    h = dense(c, c.hidden_size, ('mlp', 'embed'), 'output',
              input_activation=True)(h)
    x = layer_norm(c, 'output_layer_norm')(x + dropout(h, deterministic))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class ScannedLayer(TransformerLayer):
  """A TransformerLayer as `nn.scan`'s body: (carry, nothing scanned in) ->
  (carry, nothing scanned out); same parameters, same names."""

  def __call__(self, x, input_mask, deterministic: bool):
    return super().__call__(x, input_mask, deterministic), None


def _rematted(layer, config: BertConfig, scanned: bool):
  """`layer` under the config's rematerialization policy (itself for
  'none'). Under scan, whose loop already keeps XLA from merging the
  recomputation into the forward pass, CSE prevention is off."""
  if config.remat == 'none':
    return layer
  # self is argument 0 for the lifted remat, so `deterministic` is 3.
  return nn.remat(layer, policy=REMAT_POLICIES[config.remat],
                  prevent_cse=not scanned, static_argnums=(3,))


class BertOutput(NamedTuple):
  sequence_output: jax.Array  # [batch, length, hidden]
  pooled_output: jax.Array | None  # [batch, hidden] when add_pooler


class Bert(nn.Module):
  """BERT encoder: token ids -> contextual hidden states (and pooled [CLS])."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    if c.scan_layers:
      # One layer's parameters per step of the loop, stacked on axis 0;
      # each step draws its own initializer and dropout keys.
      self.layers = nn.scan(
          _rematted(ScannedLayer, c, scanned=True),
          variable_axes={'params': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=(nn.broadcast, nn.broadcast), length=c.num_layers,
          unroll=c.scan_unroll,
          metadata_params={nn.PARTITION_NAME: LAYERS})(c)
    else:
      layer = _rematted(TransformerLayer, c, scanned=False)
      self.layers = [layer(c, name=f'layer_{i}') for i in range(c.num_layers)]
    if c.add_pooler:
      self.pooler = dense(c, c.hidden_size, ('embed', 'mlp'), 'pooler')

  def __call__(self, token_ids, input_mask, token_type_ids=None,
               deterministic: bool = True) -> BertOutput:
    """Encodes [batch, length] token ids; input_mask is 1 on real tokens."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(token_ids)
    x = self.embeddings(token_ids, token_type_ids, deterministic)
    if self.config.scan_layers:
      # `deterministic` is broadcast as the Python bool it is (static).
      x, _ = self.layers(x, input_mask, deterministic)
    else:
      for layer in self.layers:
        x = layer(x, input_mask, deterministic)
    pooled = None
    if self.config.add_pooler:
      pooled = jnp.tanh(self.pooler(x[:, 0]))
    return BertOutput(x, pooled)

  def attend(self, hidden):
    """Tied-embedding vocabulary logits, for the masked-LM head."""
    return self.embeddings.attend(hidden)


_LAYER_KEY = re.compile(r'layer_(\d+)$')


def _stack(leaves):
  """numpy's stack for numpy leaves (an importer's, a restored checkpoint's),
  else jax's."""
  if all(isinstance(x, np.ndarray) for x in leaves):
    return np.stack(leaves)
  return jnp.stack(leaves)


def stack_layers(params: dict, num_layers: int | None = None) -> dict:
  """A Bert's parameters with unrolled layers (`layer_0` ... `layer_{L-1}`,
  scan_layers=False) in the scanned layout: every leaf of the layers stacked
  on a new leading axis under `LAYERS`; the rest (embeddings, pooler) as is.
  `num_layers` (default: as many as there are) must match the keys."""
  layers = sorted((int(m.group(1)), k) for k in params
                  if (m := _LAYER_KEY.match(k)))
  count = len(layers) if num_layers is None else num_layers
  if [i for i, _ in layers] != list(range(count)):
    raise ValueError(f'stack_layers: expected layer_0 ... layer_{count - 1}, '
                     f'got {sorted(k for _, k in layers)}.')
  stacked = {k: v for k, v in params.items() if not _LAYER_KEY.match(k)}
  stacked[LAYERS] = jax.tree.map(lambda *xs: _stack(xs),
                                 *(params[k] for _, k in layers))
  return stacked


def unstack_layers(params: dict) -> dict:
  """The inverse of `stack_layers`: a scanned Bert's parameters with one
  `layer_{i}` tree per slice of the stacked axis."""
  unrolled = {k: v for k, v in params.items() if k != LAYERS}
  count = jax.tree.leaves(params[LAYERS])[0].shape[0]
  for i in range(count):
    unrolled[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], params[LAYERS])
  return unrolled


def in_layout(params: dict, config: BertConfig) -> dict:
  """A Bert's parameters, in either layout, in the one `config` builds."""
  if config.scan_layers and LAYERS not in params:
    return stack_layers(params, config.num_layers)
  if not config.scan_layers and LAYERS in params:
    return unstack_layers(params)
  return params


def mean_pool(sequence_output, input_mask):
  """Average of the hidden states of real tokens (sentence-transformers pooling)."""
  mask = input_mask.astype(sequence_output.dtype)[..., None]
  total = jnp.sum(sequence_output * mask, axis=-2)
  return total / jnp.maximum(jnp.sum(mask, axis=-2), 1)
