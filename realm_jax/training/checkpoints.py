"""Train checkpoints through Orbax: all a run needs to continue exactly.

model_dir/checkpoints/<step>/ holds the items
  retriever_params   the towers: what the index builder and warm starts read;
  reader_params      the knowledge-augmented encoder (not in ICT runs);
  train_state        step, optimizer state and rng;
  data_position      JSON: task, seed, global batch and batches consumed.
Saves run in the background; Orbax renames a finished step into place, so a
run killed at any moment leaves its previous checkpoint whole. Old steps are
pruned through `steps.TRASH`, so the index builder never reads half of one.
"""


import jax
import orbax.checkpoint as ocp
from etils import epath

from realm_jax.index import publication, steps
from realm_jax.training.train_state import TrainState

TRAIN_STATE = 'train_state'
DATA_POSITION = 'data_position'


def _params_item(name: str) -> str:
  return f'{name}_params'


class Checkpoints:
  """Saves every `save_every` steps, keeps the newest `keep`."""

  def __init__(self, model_dir: str, save_every: int, keep: int = 3):
    self.directory = publication.checkpoints_dir(model_dir)
    self.manager = ocp.CheckpointManager(
        publication.writable(self.directory),
        options=steps.pruning_options(
            save_interval_steps=save_every, max_to_keep=keep, create=False,
            enable_async_checkpointing=True, cleanup_tmp_directories=True,
            multiprocessing_options=publication.every_process()))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def due(self, step: int) -> bool:
    """Whether `save` will save `step` (without force)."""
    return self.manager.should_save(step)

  def save(self, state: TrainState, step: int, data_position: dict,
           force: bool = False) -> bool:
    """Starts saving `state` (after `step` updates; passed in so that no
    device sync is needed) if the step is due or `force`; True if so."""
    items = {_params_item(k): ocp.args.StandardSave(v)
             for k, v in state.params.items()}
    items[TRAIN_STATE] = ocp.args.StandardSave(
        {'step': state.step, 'opt_state': state.opt_state, 'rng': state.rng})
    items[DATA_POSITION] = ocp.args.JsonSave(data_position)
    saving = self.manager.save(step, args=ocp.args.Composite(**items),
                               force=force)
    if saving:  # Steps pruned by earlier saves (this one's go at the next).
      steps.empty_trash(self.directory)
    return saving

  def restore(self, step: int, abstract: TrainState):
    """(state, data_position) of `step`, placed as `abstract`'s shardings."""
    items = {_params_item(k): ocp.args.StandardRestore(v)
             for k, v in abstract.params.items()}
    items[TRAIN_STATE] = ocp.args.StandardRestore(
        {'step': abstract.step, 'opt_state': abstract.opt_state,
         'rng': abstract.rng})
    items[DATA_POSITION] = ocp.args.JsonRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    rest = restored[TRAIN_STATE]
    state = TrainState(
        step=rest['step'], opt_state=rest['opt_state'], rng=rest['rng'],
        params={k: restored[_params_item(k)] for k in abstract.params})
    return state, restored[DATA_POSITION]

  def wait(self) -> None:
    self.manager.wait_until_finished()
    steps.empty_trash(self.directory)

  def close(self) -> None:
    self.manager.close()
    steps.empty_trash(self.directory)


def restore_params(model_dir: str, step: int | None = None
                   ) -> tuple[int, dict]:
  """(step, {'retriever': ..., 'reader': ...}) of a run's checkpoint `step`
  (default the newest), for warm starts and evaluation; 'reader' only if the
  run had one. The run may still be training and pruning its checkpoints."""
  manager = publication.trainer_checkpoints(model_dir)

  def read(step):
    names = [name for name in ('retriever', 'reader') if (
        epath.Path(manager.directory) / str(step) / _params_item(name)
    ).is_dir()]
    restored = steps.restore(manager, step, ocp.args.Composite(**{
        _params_item(n): ocp.args.StandardRestore() for n in names}))
    return None if restored is None else {
        n: jax.device_get(restored[_params_item(n)]) for n in names}

  if step is None:
    step, params = steps.newest(manager, read)
    if step is None:
      raise FileNotFoundError(
          f'No checkpoint under {publication.checkpoints_dir(model_dir)}.')
    return step, params
  kept = steps.reload(manager)
  params = read(step) if step in kept else None
  if params is None:
    raise FileNotFoundError(
        f'No checkpoint {step} under {publication.checkpoints_dir(model_dir)};'
        f' kept: {steps.reload(manager)}.')
  return step, params
