"""Every matrix product of the model, in the mixed-precision policy.

Operands are rounded to the compute dtype and accumulated in float32, as
the hardware does anyway. What a product returns depends on its target
(`target.target_platform()`): on GPUs and TPUs the compute dtype, which
halves the bytes each product writes and the next op reads; on CPUs float32,
because XLA:CPU computes bfloat16 x bfloat16 -> float32 at about twice its
float32 rate on AVX512_BF16 and a bfloat16 result would make it a float32
matmul. Scores a softmax reads (attention logits, vocabulary logits,
retrieval scores) ask for float32 everywhere.
"""

import functools

import jax
import jax.numpy as jnp

from realm_jax.models import target


def result_dtype(dtype) -> jnp.dtype:
  """What a product in compute dtype `dtype` returns on the target."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32 or target.target_platform() == 'cpu':
    return jnp.dtype(jnp.float32)
  return dtype


def contract(spec: str, a, b, dtype, result=None):
  """jnp.einsum(spec, a, b) on operands rounded to `dtype`, accumulated in
  float32 and returned as `result` (default `result_dtype(dtype)`).

  In the backward pass the cotangent is rounded to `dtype` too, and each
  gradient is returned in its operand's own dtype: a float32 kernel's
  gradient is the float32 sum, never rounded to bfloat16.
  """
  result = result_dtype(dtype) if result is None else jnp.dtype(result)
  return _contract(spec, jnp.dtype(dtype).name, result.name, a, b)


def _batched(spec: str) -> bool:
  """Whether an axis of `spec` is in both operands and the result."""
  operands, out = spec.split('->')
  a, b = operands.split(',')
  return bool(set(a) & set(b) & set(out))


def _product(spec: str, a, b, result):
  """einsum of two operands of one dtype, accumulated in float32 and
  returned as `result`."""
  if a.dtype != jnp.float32 and _batched(spec) and (
      target.target_platform() == 'cpu'):
    # XLA:CPU (jax 0.10) has no bfloat16 x bfloat16 -> float32 kernel for
    # some batched layouts ("Unsupported element type for DotThunk"). The
    # same sum in float32: products of bfloat16 values are exact in float32.
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return jnp.einsum(spec, a, b, preferred_element_type=result)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _contract(spec, dtype, result, a, b):
  return _product(spec, a.astype(dtype), b.astype(dtype), result)


def _contract_fwd(spec, dtype, result, a, b):
  low_a, low_b = a.astype(dtype), b.astype(dtype)
  # Empty arrays carry the operands' dtypes to the backward pass.
  return _product(spec, low_a, low_b, result), (
      low_a, low_b, jnp.zeros(0, a.dtype), jnp.zeros(0, b.dtype))


def _contract_bwd(spec, dtype, result, residuals, cotangent):
  """The two transposed products, on the cotangent rounded to `dtype`."""
  del result
  low_a, low_b, like_a, like_b = residuals
  operands, out = spec.split('->')
  a_spec, b_spec = operands.split(',')
  cotangent = cotangent.astype(dtype)
  # A float32 operand's gradient is a float32 sum; a low-precision one's is
  # returned as a product in the compute dtype would be.
  grad_dtype = lambda like: (jnp.float32 if like.dtype == jnp.float32 else
                             result_dtype(like.dtype))
  return (_product(f'{out},{b_spec}->{a_spec}', cotangent, low_b,
                   grad_dtype(like_a)).astype(like_a.dtype),
          _kernel_gradient(spec, low_a, cotangent,
                           grad_dtype(like_b)).astype(like_b.dtype))


def _kernel_gradient(spec: str, a, cotangent, result):
  """The gradient of b: the product of `a` and the cotangent over their
  shared axes (every token, for a dense layer's kernel).

  XLA:CPU copies the first operand of that product into a transposed
  layout, at a few GB/s. When `a` is the larger (the feed-forward layer's
  output projection reads 4H per token and its cotangent H), the cotangent
  goes first and the small result is transposed after: a tiny BERT's
  training step runs 11% faster (docs/levers.md). The barrier keeps XLA
  from folding that transpose back into the product. Other targets read
  either layout in place."""
  operands, out = spec.split('->')
  a_spec, b_spec = operands.split(',')
  if (target.target_platform() != 'cpu' or _batched(spec)
      or a.size <= cotangent.size):
    return _product(f'{a_spec},{out}->{b_spec}', a, cotangent, result)
  swapped = ''.join(x for x in b_spec if x not in a_spec) + ''.join(
      x for x in b_spec if x in a_spec)
  product = jax.lax.optimization_barrier(
      _product(f'{out},{a_spec}->{swapped}', cotangent, a, result))
  return jnp.einsum(f'{swapped}->{b_spec}', product)


_contract.defvjp(_contract_fwd, _contract_bwd)
