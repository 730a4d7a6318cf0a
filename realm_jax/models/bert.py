"""BERT in Flax Linen, the transformer under every REALM tower.

Post-LN BERT (Devlin et al. 2019) with logical axis names on every parameter and
activation, so one table of rules (training/partitioning) decides the sharding.
Parameters stay a plain pytree once unboxed: Orbax saves it and the index
builder can load the document tower by sub-tree.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
from flax import linen as nn

from realm_jax.models.attention import attend
from realm_jax.models.products import contract


ACTIVATIONS = {
    'gelu': functools.partial(nn.gelu, approximate=False),
    'gelu_new': functools.partial(nn.gelu, approximate=True),
}


def _dtype(value) -> jnp.dtype:
  """Accepts 'bfloat16', jnp.bfloat16 or a numpy dtype (gin passes strings)."""
  return jnp.dtype(value)


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
    remat: rematerialize each layer in the backward pass (saves memory).
    add_pooler: add BERT's tanh pooler over [CLS] (the released REALM towers
      project its output; our own towers project the raw [CLS]).
    hidden_act: 'gelu' (exact, erf) or 'gelu_new' (the tanh approximation of
      Google's original BERT code, which the released REALM models use).
    attention_chunk: sequences XLA's attention takes at a time on CPU
      (models/attention.py); None: 2 on CPU, all at once elsewhere.
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
  remat: bool = False
  add_pooler: bool = False
  hidden_act: str = 'gelu'
  attention_chunk: int | None = None
  attention_implementation: str | None = None

  def __post_init__(self):
    object.__setattr__(self, 'dtype', _dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', _dtype(self.param_dtype))
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
    """The feed-forward (and masked-LM transform) nonlinearity."""
    return ACTIVATIONS[self.hidden_act](x)


def _init(config: BertConfig, names: tuple[str, ...]):
  """BERT's truncated-normal initializer, annotated with logical axis names."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), names)


def layer_norm(config: BertConfig, name: str, axis_name: str = 'embed',
               epsilon: float | None = None, dtype=None):
  """LayerNorm over the last axis, whose logical name is `axis_name`;
  `epsilon` defaults to the config's. Its statistics are float32; it returns
  `dtype` (default the compute dtype)."""
  return nn.LayerNorm(
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
  softmax reads, whose product then returns float32 too).
  """
  config: BertConfig
  features: tuple[int, ...]
  kernel_names: tuple[str, ...]
  in_axes: int = 1
  dtype: Any = None

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
    y = contract(f'...{inputs},{inputs}{outputs}->...{outputs}', x, kernel,
                 c.dtype, jnp.float32 if dtype == jnp.float32 else None)
    return (y + bias).astype(dtype)


def dense(config: BertConfig, features, kernel_names: tuple[str, ...],
          name: str, in_axes: int = 1, dtype=None) -> Dense:
  """BERT-initialized dense layer; the bias takes the output axis names."""
  features = tuple(features) if isinstance(features, (tuple, list)) else (
      features,)
  return Dense(config, features, kernel_names, in_axes, dtype, name=name)


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
                     c.attention_chunk, c.attention_implementation)
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
    h = nn.with_logical_constraint(c.activation(h),
                                   ('batch', 'length', 'mlp'))
    h = dense(c, c.hidden_size, ('mlp', 'embed'), 'output')(h)
    x = layer_norm(c, 'output_layer_norm')(x + dropout(h, deterministic))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class BertOutput(NamedTuple):
  sequence_output: jax.Array  # [batch, length, hidden]
  pooled_output: jax.Array | None  # [batch, hidden] when add_pooler


class Bert(nn.Module):
  """BERT encoder: token ids -> contextual hidden states (and pooled [CLS])."""
  config: BertConfig

  def setup(self):
    c = self.config
    # self is argument 0 for the lifted remat, so `deterministic` is 3.
    layer = (nn.remat(TransformerLayer, static_argnums=(3,))
             if c.remat else TransformerLayer)
    self.embeddings = Embeddings(c)
    self.layers = [layer(c, name=f'layer_{i}') for i in range(c.num_layers)]
    if c.add_pooler:
      self.pooler = dense(c, c.hidden_size, ('embed', 'mlp'), 'pooler')

  def __call__(self, token_ids, input_mask, token_type_ids=None,
               deterministic: bool = True) -> BertOutput:
    """Encodes [batch, length] token ids; input_mask is 1 on real tokens."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(token_ids)
    x = self.embeddings(token_ids, token_type_ids, deterministic)
    for layer in self.layers:
      x = layer(x, input_mask, deterministic)
    pooled = None
    if self.config.add_pooler:
      pooled = jnp.tanh(self.pooler(x[:, 0]))
    return BertOutput(x, pooled)

  def attend(self, hidden):
    """Tied-embedding vocabulary logits, for the masked-LM head."""
    return self.embeddings.attend(hidden)


def mean_pool(sequence_output, input_mask):
  """Average of the hidden states of real tokens (sentence-transformers pooling)."""
  mask = input_mask.astype(sequence_output.dtype)[..., None]
  total = jnp.sum(sequence_output * mask, axis=-2)
  return total / jnp.maximum(jnp.sum(mask, axis=-2), 1)
