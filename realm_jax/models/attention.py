"""Scaled dot-product attention, one function with a kernel per target.

- CPU: XLA's form. In the forward passes alone (evaluation, embedding,
  serving) a `chunk` of sequences at a time: XLA:CPU writes the whole
  [batch, heads, length, length] score tensor to memory before the softmax
  reads it back, and a loop over pairs of sequences keeps each pair's
  scores in cache (MiniLM at 288 wordpieces runs 1.8x faster,
  docs/benchmarks.md). Training takes the one-shot form: the loop's
  backward pass costs more than the cache saves (docs/levers.md).
- GPU: cuDNN's fused attention (`jax.nn.dot_product_attention`), which
  never writes the scores to memory and keeps only the output and the
  softmax statistics for the backward pass.
- TPU: the Pallas splash-attention kernel, likewise fused.

The fused kernels take the padding as lengths (cuDNN) or segment ids
(splash): every mask here is right-padded, real tokens first. They drop
no attention probabilities, so with attention dropout active (training
with `BertConfig.attention_dropout_rate` > 0) the automatic choice keeps
XLA's form and says so once; the accelerator setups (gin/setups/gpu.gin,
tpu_v4.gin) set the rate to 0 so that training takes the fused kernel
(docs/training.md, "Attention dropout").
"""

import functools
import logging

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from realm_jax.models import target
from realm_jax.models.products import contract

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ('xla', 'cudnn', 'splash')
# Sequences are padded to a multiple of the splash kernel's block.
SPLASH_BLOCK = 128


def reference(query, key, value, input_mask, dtype, dropout=None):
  """softmax(q k^T / sqrt(d)) v over [batch, length, heads, head_dim], the
  float32 scores written out; a fully padded row attends uniformly."""
  logits = contract('bqhd,bkhd->bhqk', query, key, dtype,
                    jnp.float32) / jnp.sqrt(jnp.float32(query.shape[-1]))
  logits = jnp.where(input_mask[:, None, None, :].astype(bool), logits,
                     jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dtype)
  if dropout is not None:
    probs = dropout(probs)
  return contract('bhqk,bkhd->bqhd', probs, value, dtype).astype(dtype)


def _chunked(query, key, value, input_mask, dtype, chunk: int):
  one = lambda args: reference(*(a[None] for a in args), dtype)[0]
  return jax.lax.map(one, (query, key, value, input_mask), batch_size=chunk)


def _lengths(input_mask):
  """Each right-padded row's length; at least 1, so that a fully padded row
  (whose outputs nothing reads) divides by no empty sum."""
  return jnp.maximum(jnp.sum(input_mask.astype(jnp.int32), axis=-1), 1)


def _cudnn(query, key, value, input_mask, dtype, implementation='cudnn'):
  """cuDNN's fused kernel; `implementation='xla'` runs the same call on any
  backend, which is how CPU tests check the lengths it is given. Shapes
  cuDNN refuses (it says so while tracing) take XLA's form, said once."""
  lengths = _lengths(input_mask)
  try:
    return jax.nn.dot_product_attention(
        query.astype(dtype), key.astype(dtype), value.astype(dtype),
        scale=float(query.shape[-1]) ** -0.5, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=implementation)
  except NotImplementedError as refusal:
    _say_refused(str(refusal))
    return reference(query, key, value, input_mask, dtype)


@functools.cache
def _say_refused(reason: str) -> None:
  log.warning('cuDNN fused attention refused these shapes (%s); XLA\'s '
              'unfused form instead.', reason)


def _splash_kernel(heads: int, length: int, interpret: bool):
  # Deferred: Pallas's TPU kernels are only needed where splash runs.
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as kernel, splash_attention_mask as masks)
  full = masks.MultiHeadMask([masks.FullMask((length, length))] * heads)
  return kernel.make_splash_mha(full, head_shards=1, q_seq_shards=1,
                                interpret=interpret), kernel.SegmentIds


def _splash(query, key, value, input_mask, dtype, interpret: bool = False):
  """The splash kernel over [batch, heads, length, head_dim], the length
  padded to a multiple of its block; padding is segment 0, real tokens
  segment 1, and a segment attends only to itself. On a mesh it runs under
  shard_map (a Mosaic kernel is not partitioned automatically): batch over
  'data', heads over 'model'."""
  batch, length, heads, head_dim = query.shape
  padded = -(-length // SPLASH_BLOCK) * SPLASH_BLOCK
  pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] +
                          [(0, 0)] * (x.ndim - 2))
  # [batch, length, heads, d] -> [batch, heads, length, d]; the kernel does
  # not scale the scores.
  to_heads = lambda x: jnp.swapaxes(pad(x.astype(dtype)), 1, 2)
  q = to_heads(query * jnp.asarray(head_dim ** -0.5, query.dtype))
  k, v = to_heads(key), to_heads(value)
  segment_ids = pad(input_mask.astype(jnp.int32))
  kernel, segments = _splash_kernel(heads, padded, interpret)
  per_example = jax.vmap(
      lambda q, k, v, s: kernel(q, k, v, segment_ids=segments(s, s)))

  mesh = target.target_mesh()
  if mesh is not None and mesh.size > 1:
    data = 'data' if batch % mesh.shape.get('data', 1) == 0 else None
    model = 'model' if heads % mesh.shape.get('model', 1) == 0 and (
        'model' in mesh.shape) else None
    spec = P(data, model, None, None)
    per_example = jax.shard_map(
        per_example, mesh=mesh, in_specs=(spec, spec, spec, P(data, None)),
        out_specs=spec, check_vma=False)
  out = per_example(q, k, v, segment_ids)
  return jnp.swapaxes(out, 1, 2)[:, :length].astype(dtype)


def choose(implementation: str | None, dtype, dropout_active: bool) -> str:
  """The kernel to run: `implementation` if given, else the target's fused
  kernel where it applies, else XLA's."""
  if implementation is not None:
    if implementation not in IMPLEMENTATIONS:
      raise ValueError(f'BertConfig.attention_implementation='
                       f'{implementation!r}; expected one of '
                       f'{IMPLEMENTATIONS} or None (by target).')
    if implementation != 'xla' and dropout_active:
      raise ValueError(
          f'BertConfig.attention_implementation={implementation!r} drops no '
          'attention probabilities: set BertConfig.attention_dropout_rate '
          "= 0, or attention_implementation = 'xla'.")
    return implementation
  platform = target.target_platform()
  fused = {'gpu': 'cudnn', 'tpu': 'splash'}.get(platform)
  if fused == 'cudnn' and jnp.dtype(dtype).itemsize != 2:
    fused = None  # cuDNN's kernel takes bfloat16 or float16.
  if fused and dropout_active:
    _say_once(platform, fused)
    fused = None
  return fused or 'xla'


@functools.cache
def _say_once(platform: str, fused: str) -> None:
  log.warning('Attention dropout is on, so attention on %s is XLA\'s '
              'unfused form, not %s: BertConfig.attention_dropout_rate = 0 '
              '(gin/setups/%s.gin sets it) selects the fused kernel.',
              platform.upper(), fused, 'gpu' if platform == 'gpu' else
              'tpu_v4')


def attend(query, key, value, input_mask, dtype, dropout=None,
           chunk: int | None = None, implementation: str | None = None,
           training: bool = False):
  """Self-attention of [batch, length, heads, head_dim] queries over the
  unpadded keys (`input_mask` [batch, length], 1 on real tokens, right-
  padded), in compute dtype `dtype`. `dropout` (a callable on the
  probabilities) is applied by XLA's form only; `chunk` is the sequences
  XLA's form attends at a time (None: 2 on CPU outside `training`, all
  elsewhere)."""
  kernel = choose(implementation, dtype, dropout is not None)
  platform = target.target_platform()
  # Asked for on a target that cannot run it, a fused kernel runs in its
  # portable form, same arguments: cuDNN's call through XLA, the splash
  # kernel in Pallas's interpreter (how CPU tests check them).
  if kernel == 'cudnn':
    return _cudnn(query, key, value, input_mask, dtype,
                  'cudnn' if platform == 'gpu' else 'xla')
  if kernel == 'splash':
    return _splash(query, key, value, input_mask, dtype,
                   interpret=platform != 'tpu')
  if chunk is None:
    chunk = 2 if platform == 'cpu' and not training else 0
  if dropout is not None or not chunk:
    return reference(query, key, value, input_mask, dtype, dropout)
  return _chunked(query, key, value, input_mask, dtype, chunk)
