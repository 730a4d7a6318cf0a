"""Train checkpoints through Orbax: all a run needs to continue exactly.

Each step (model_dir/checkpoints/<step>, see `run_directory`) holds one
`<name>_params` item per parameter tree (the towers, the reader), the
train state (step, optimizer state, rng) and the data position (JSON: task,
seed, global batch and batches consumed). Saves run in the background; Orbax
renames a finished step into place, so a run killed at any moment leaves its
previous checkpoint whole. Old steps are pruned through the trash, so the
index builder never reads half of one. Readers of a finished or running
run's parameters use `run_directory.restore_params`.
"""

import orbax.checkpoint as ocp

from realm_jax import run_directory
from realm_jax.run_directory import DATA_POSITION, TRAIN_STATE, params_item
from realm_jax.training.train_state import TrainState


class Checkpoints:
  """Saves every `save_every` steps, keeps the newest `keep`."""

  def __init__(self, model_dir: str, save_every: int, keep: int = 3):
    self.directory = run_directory.checkpoints_dir(model_dir)
    self.manager = ocp.CheckpointManager(
        run_directory.writable(self.directory),
        options=run_directory.pruning_options(
            save_interval_steps=save_every, max_to_keep=keep, create=False,
            enable_async_checkpointing=True, cleanup_tmp_directories=True,
            multiprocessing_options=run_directory.every_process()))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def due(self, step: int) -> bool:
    """Whether `save` will save `step` (without force)."""
    return self.manager.should_save(step)

  def save(self, state: TrainState, step: int, data_position: dict,
           force: bool = False) -> bool:
    """Starts saving `state` (after `step` updates; passed in so that no
    device sync is needed) if the step is due or `force`; True if so."""
    items = {params_item(k): ocp.args.StandardSave(v)
             for k, v in state.params.items()}
    items[TRAIN_STATE] = ocp.args.StandardSave(
        {'step': state.step, 'opt_state': state.opt_state, 'rng': state.rng})
    items[DATA_POSITION] = ocp.args.JsonSave(data_position)
    saving = self.manager.save(step, args=ocp.args.Composite(**items),
                               force=force)
    if saving:  # Steps pruned by earlier saves (this one's go at the next).
      run_directory.empty_trash(self.directory)
    return saving

  def restore(self, step: int, abstract: TrainState):
    """(state, data_position) of `step`, placed as `abstract`'s shardings."""
    items = {params_item(k): ocp.args.StandardRestore(v)
             for k, v in abstract.params.items()}
    items[TRAIN_STATE] = ocp.args.StandardRestore(
        {'step': abstract.step, 'opt_state': abstract.opt_state,
         'rng': abstract.rng})
    items[DATA_POSITION] = ocp.args.JsonRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    rest = restored[TRAIN_STATE]
    state = TrainState(
        step=rest['step'], opt_state=rest['opt_state'], rng=rest['rng'],
        params={k: restored[params_item(k)] for k in abstract.params})
    return state, restored[DATA_POSITION]

  def wait(self) -> None:
    self.manager.wait_until_finished()
    run_directory.empty_trash(self.directory)

  def close(self) -> None:
    self.manager.close()
    run_directory.empty_trash(self.directory)
