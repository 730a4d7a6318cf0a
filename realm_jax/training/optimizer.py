"""BERT's optimizer: AdamW, linear warmup then linear decay, gradient clipping.

Weight decay applies to kernels and embeddings only, never to LayerNorm
parameters or biases, as in BERT's `AdamWeightDecayOptimizer`.
"""

import gin
import jax
import jax.numpy as jnp
import optax

from realm_jax import errors

_NO_DECAY = ('bias', 'scale', 'output_bias')


def bert_schedule(learning_rate: float, warmup_steps: int,
                  total_steps: int) -> optax.Schedule:
  """0 -> learning_rate over warmup_steps, then linearly to 0 at total_steps.
  A run of no step (its warm start checkpointed and indexed, to be scored
  as a trained run is) has no warm-up either."""
  if total_steps < 0:
    raise errors.BadConfig(f'train.num_steps={total_steps}: give 0 or more '
                           'steps.')
  if warmup_steps < 0:
    raise errors.BadConfig(f'bert_adamw.warmup_steps={warmup_steps}: give 0 '
                           'or more warm-up steps.')
  if warmup_steps >= total_steps and warmup_steps:
    raise errors.BadConfig(
        f'bert_adamw.warmup_steps={warmup_steps} must be in [0, '
        f'train.num_steps={total_steps}): give fewer warm-up steps.')
  return optax.join_schedules([
      optax.linear_schedule(0.0, learning_rate, warmup_steps),
      optax.linear_schedule(learning_rate, 0.0, total_steps - warmup_steps),
  ], [warmup_steps])


def decay_mask(params):
  """True where weight decay applies: not LayerNorm scale/bias, not biases."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], 'key', None) not in _NO_DECAY, params)


@gin.configurable
def bert_adamw(learning_rate: float = 3e-5, warmup_steps: int = 10_000,
               total_steps: int = 200_000, weight_decay: float = 0.01,
               clip_norm: float = 1.0, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-6, frozen=None,
               retriever_learning_rate_scale: float = 1.0,
               retriever_frozen_steps: int = 0
               ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(AdamW, its schedule); the paper's pre-training defaults.

  lr 3e-5 pre-training, 1e-4 ICT, 1e-5 fine-tuning. `frozen` maps params to a
  bool tree, True where a parameter must not move (no update, no decay).
  `retriever_learning_rate_scale` multiplies the updates of the 'retriever'
  parameters (both towers) of a run with a reader: the paper trains both at
  one rate; Atlas trains its retriever 10x slower (0.1). ICT, which has no
  reader, is left alone. `retriever_frozen_steps` holds those parameters
  still for the first steps (a reader-first curriculum, Atlas's
  `freeze_retriever_steps`): the reader learns to use a fixed retriever's
  blocks before r(z) moves the towers.
  """
  schedule = bert_schedule(learning_rate, warmup_steps, total_steps)
  tx = optax.chain(
      optax.clip_by_global_norm(clip_norm),
      optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                  mask=decay_mask))
  if retriever_learning_rate_scale != 1.0 or retriever_frozen_steps:
    retriever = lambda params: {
        name: jax.tree.map(lambda _: name == 'retriever' and 'reader' in
                           params, tree) for name, tree in params.items()}
    scale = lambda step: jnp.where(step < retriever_frozen_steps, 0.0,
                                   retriever_learning_rate_scale)
    tx = optax.chain(tx, optax.masked(optax.scale_by_schedule(scale),
                                      retriever))
  if frozen is not None:
    labels = lambda params: jax.tree.map(
        lambda f: 'frozen' if f else 'trained', frozen(params))
    tx = optax.multi_transform({'trained': tx, 'frozen': optax.set_to_zero()},
                               labels)
  return tx, schedule
