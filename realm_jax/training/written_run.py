"""A run directory written from parameters alone, as a finished run leaves
it: a model's fresh parameters, the weights read over them, saved as the
run's checkpoint and marked done. `realm-jax import` writes Google's
released REALM this way, and `import --export` an export."""

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import linen as nn

from realm_jax import run_directory, run_guard
from realm_jax.models.realm import Realm


def merged(base: dict, update: dict) -> dict:
  """`base` with every leaf `update` holds put over it."""
  return {k: (merged(base[k], update[k]) if isinstance(update.get(k), dict)
              else update.get(k, base[k])) for k in base}


def fresh_params(model: Realm, seed: int = 0) -> dict:
  """A REALM model's initial parameters (numpy), to read weights over."""
  ones = lambda *shape: {k: np.ones(shape, np.int32) for k in (
      'token_ids', 'input_mask', 'token_type_ids')}
  return nn.meta.unbox(model.init(
      jax.random.key(seed), ones(1, 8), ones(1, 2, 8),
      np.zeros((1, 1), np.int32)))['params']


def save_params(model_dir: str, step: int, params: dict) -> None:
  """`params` ({part: tree}) as the run's checkpoint `step`, the run marked
  done."""
  # The layout the checkpoint is written in, as a trainer records it.
  run_guard.check_format(model_dir)
  manager = ocp.CheckpointManager(
      run_directory.writable(run_directory.checkpoints_dir(model_dir)),
      options=run_directory.pruning_options(
          create=False, enable_async_checkpointing=False,
          multiprocessing_options=run_directory.every_process()))
  manager.save(step, args=ocp.args.Composite(**{
      run_directory.params_item(k): run_directory.StandardSave(v)
      for k, v in params.items()}))
  manager.wait_until_finished()
  run_directory.mark_training_done(model_dir)
