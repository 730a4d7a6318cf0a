"""Analytic FLOP counts: the numerator of model FLOPs utilisation (MFU); and
its denominator where no data sheet gives one, a measured matmul rate.

Matrix multiplications only, 2 FLOPs per multiply-add; softmax, GELU and
LayerNorm are left out (a few percent at BERT's widths), as are rematerialized
recomputations: MFU counts what the model needs, not what the program did. A
training step is 3x its forward pass (the backward pass computes the
gradients of both operands of every matmul).
"""

import statistics
import time

import jax
import jax.numpy as jnp

from realm_jax.models.bert import BertConfig

# Dense bf16 TFLOP/s per chip, from the vendors' data sheets: the
# denominator of MFU on an accelerator.
NOMINAL_BF16 = {
    'TPU v4': 275e12,
    'TPU v5 lite': 197e12,
    'TPU v5p': 459e12,
    'NVIDIA H100 80GB HBM3': 989e12,
    'NVIDIA H200': 989e12,
    'NVIDIA A100-SXM4-80GB': 312e12,
}


def measured_matmul(dtype=jnp.float32, size: int = 2048, calls: int = 5,
                    accumulate=None) -> float:
  """FLOP/s of a size^3 JAX matmul on the default device, the median of
  `calls`, with random operands (zeros can run faster) and its result in
  `accumulate` (default `dtype`): bfloat16 operands with a float32 result is
  the mixed-precision policy's product. Every timing names the 2048^3
  float32 rate, and every MFU on a CPU divides by it."""
  x = jax.random.normal(jax.random.key(0), (size, size), dtype)
  matmul = jax.jit(lambda a: jnp.matmul(a, a,
                                        preferred_element_type=accumulate))
  matmul(x).block_until_ready()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    matmul(x).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * size ** 3 / statistics.median(times)


def encoder_forward(config: BertConfig, length: int) -> float:
  """One sequence of `length` through every layer of a BERT."""
  h, i = config.hidden_size, config.intermediate_size
  per_layer = (2 * length * 4 * h * h      # Q, K, V and output projections
               + 2 * 2 * length * length * h  # scores and weighted values
               + 2 * 2 * length * h * i)   # the feed-forward layer
  return config.num_layers * per_layer


def masked_lm_head(config: BertConfig, masked: int) -> float:
  """The transform and the tied vocabulary projection at `masked` tokens."""
  h = config.hidden_size
  return 2 * masked * (h * h + h * config.vocab_size)


def tower(config: BertConfig, length: int, projection_size: int) -> float:
  """A retriever tower: the encoder, then the projection to the index."""
  return (encoder_forward(config, length)
          + 2 * config.hidden_size * projection_size)


def pretrain_example(retriever: BertConfig, reader: BertConfig,
                     projection_size: int, query_length: int,
                     block_length: int, reader_length: int,
                     num_candidates: int, masked: int) -> float:
  """Forward FLOPs of one REALM pre-training example inside the step: the
  query tower, the k candidates' document tower (re-embedded so gradients
  reach it) and k reader passes with their masked-LM heads."""
  k = num_candidates
  return (tower(retriever, query_length, projection_size)
          + k * tower(retriever, block_length, projection_size)
          + k * (encoder_forward(reader, reader_length)
                 + masked_lm_head(reader, masked)))


def ict_example(retriever: BertConfig, projection_size: int,
                query_length: int, block_length: int, batch_size: int) -> float:
  """Forward FLOPs of one ICT example: both towers and its row of the
  in-batch score matrix."""
  return (tower(retriever, query_length, projection_size)
          + tower(retriever, block_length, projection_size)
          + 2 * batch_size * projection_size)


def train(forward: float) -> float:
  return 3 * forward
