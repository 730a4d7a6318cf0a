"""The one train loop: ICT warm-start, REALM pre-training and Open-QA fine-tuning.

The step is one `jax.jit` with explicit in/out shardings over a ('data',
'model') mesh and the state donated. The run kind (see `run_kinds`) supplies
the task and the warm start, its objective the loss, and its input preparer
the host-side retrieval. The loop
retrieves each batch while the device runs the step before it, saves
asynchronous Orbax checkpoints, resumes from the newest one with the data
order unchanged, stops on a non-finite loss, and writes metrics (see
`metric_writer`) and a progress line.
"""

import contextlib
import logging
import math
import os
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import linen as nn

from realm_jax import distributed, errors, run_directory, run_guard
from realm_jax.models import target
from realm_jax.progress import Progress
from realm_jax.input.source import Source
from realm_jax.training import optimizer, partitioning
from realm_jax.training.step_inputs import InputPreparer, record_vocabulary
from realm_jax.training.checkpoints import Checkpoints
from realm_jax.training.curves import plot_curves
from realm_jax.training.metric_writer import (create_writer, drop_rows_after,
                                              metrics_path)
from realm_jax.training.objectives import Objective
from realm_jax.training.run_kinds import RunKind
from realm_jax.training.train_state import TrainState

log = logging.getLogger(__name__)


class Trainer:
  """An objective's parameters, optimizer and jitted step on one mesh.

  It needs no data and no index: enough to `lower` the step ahead of time.
  With the objective's `microbatches` > 1 the step runs the forward and
  backward passes on that many equal slices of the batch in turn and
  averages their losses and gradients, so only one slice's activations are
  live at a time (what fits BERT-base at batch 512 on 64 chips;
  docs/scaling.md). With a `memory_budget` (bytes a device may allocate for
  the step beyond its arguments), the first step is compiled ahead and the
  batch split into more microbatches until XLA's memory analysis says it
  fits (`fit_microbatches`).
  """

  def __init__(self, objective: Objective, mesh, num_steps: int,
               seed: int = 0, memory_budget: int | None = None):
    self.objective, self.mesh = objective, mesh
    self.memory_budget = memory_budget
    self.platform = target.platform_of(mesh.devices)
    self.microbatches = objective.microbatches
    self.rng = jax.random.PRNGKey(seed)
    boxed = jax.eval_shape(objective.init, self.rng)
    self.param_shardings = partitioning.logical_shardings(boxed, mesh)
    abstract_params = nn.meta.unbox(boxed)
    self.frozen = frozen = objective.frozen(abstract_params)
    # The schedule decays to zero at the run's last step.
    self.tx, self.schedule = optimizer.bert_adamw(
        total_steps=num_steps,
        frozen=None if frozen is None else lambda _: frozen)
    abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
    replicated = partitioning.replicated(mesh)
    self.state_shardings = TrainState(
        step=replicated, rng=replicated, params=self.param_shardings,
        opt_state=partitioning.state_shardings(abstract_opt,
                                               self.param_shardings, mesh))
    # What a checkpoint restores into: shapes, dtypes and shardings.
    self.abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        TrainState(step=jax.ShapeDtypeStruct((), jnp.int32),
                   params=abstract_params, opt_state=abstract_opt,
                   rng=jax.ShapeDtypeStruct((2,), jnp.uint32)),
        self.state_shardings)
    self._step = None
    # The deterministic loss' metrics, for held-out evaluation.
    self.evaluate = jax.jit(self._evaluate)

  def fresh_params(self):
    """Newly initialized parameters, placed as the step shards them."""
    return jax.jit(lambda rng: nn.meta.unbox(self.objective.init(rng)),
                   out_shardings=self.param_shardings)(self.rng)

  def initial_state(self, params=None) -> TrainState:
    """Step 0 from `params` (default `fresh_params`), with Adam's state."""
    params = jax.device_put(
        self.fresh_params() if params is None else params,
        self.param_shardings)
    opt_state = jax.jit(self.tx.init,
                        out_shardings=self.state_shardings.opt_state)(params)
    return jax.device_put(
        TrainState(step=jnp.zeros((), jnp.int32), params=params,
                   opt_state=opt_state, rng=self.rng), self.state_shardings)

  def loss_and_grads(self, params, inputs, rng):
    """((loss, metrics), gradients) of one batch, in training mode. The
    parameters the objective freezes get a zero gradient through
    stop_gradient, so XLA drops the backward pass only they need."""

    def loss(params):
      if self.frozen is not None:
        params = jax.tree.map(
            lambda p, f: jax.lax.stop_gradient(p) if f else p, params,
            self.frozen)
      return self.objective.loss(params, inputs, rng, False)
    return jax.value_and_grad(loss, has_aux=True)(params)

  def gradients(self, params, inputs, rng):
    """(metrics, gradients) of a global batch: their means over the
    microbatches, slice m being rows m, m + M, m + 2M, ... (so every device
    keeps its rows), with dropout key fold_in(rng, m)."""
    count = self.microbatches
    if count == 1:
      (_, metrics), grads = self.loss_and_grads(params, inputs, rng)
      return metrics, grads
    batch = jax.tree.leaves(inputs)[0].shape[0]
    if batch % (count * self.mesh.shape['data']):
      raise ValueError(f'microbatches={count} must divide the batch '
                       f'of {batch} into slices spread over the '
                       f'{self.mesh.shape["data"]} data-parallel devices.')
    sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(
        None, 'data'))
    slices = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        jnp.swapaxes(x.reshape(batch // count, count, *x.shape[1:]), 0, 1),
        sharding), inputs)

    def accumulate(total, slice_and_index):
      piece, index = slice_and_index
      (_, metrics), grads = self.loss_and_grads(
          params, piece, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, total, (metrics, grads)), None

    (_, metrics), grads = jax.eval_shape(
        self.loss_and_grads, params, jax.tree.map(lambda x: x[0], slices), rng)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         (metrics, grads))
    (metrics, grads), _ = jax.lax.scan(accumulate, zeros,
                                       (slices, jnp.arange(count)))
    return jax.tree.map(lambda x: x / count, (metrics, grads))

  def _evaluate(self, params, inputs):
    with target.compiling_for(self.platform, self.mesh):
      return self.objective.loss(params, inputs, self.rng, True)[1]

  def _train_step(self, state: TrainState, inputs):
    rng = jax.random.fold_in(state.rng, state.step)
    with target.compiling_for(self.platform, self.mesh):
      metrics, grads = self.gradients(state.params, inputs, rng)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    metrics = {**metrics, 'learning_rate': self.schedule(state.step),
               'gradient_norm': jnp.sqrt(sum(
                   jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))}
    return state.replace(step=state.step + 1,
                         params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), metrics

  def _jit_step(self, inputs):
    return jax.jit(
        self._train_step,
        in_shardings=(self.state_shardings,
                      jax.tree.map(lambda _: partitioning.batch_sharding(
                          self.mesh), inputs)),
        out_shardings=(self.state_shardings,
                       partitioning.replicated(self.mesh)),
        donate_argnums=(0,))

  def step(self, state: TrainState, inputs) -> tuple[TrainState, dict]:
    """One update; `inputs` are this process's rows (numpy)."""
    inputs = partitioning.global_batch(inputs, self.mesh)
    if self._step is None:
      if self.memory_budget is None:
        self._step = self._jit_step(inputs)
      else:
        self._step = self.fit_microbatches(state, inputs, self.memory_budget)
    return self._step(state, inputs)

  def step_memory(self, state, inputs):
    """(compiled step, bytes it allocates beyond its arguments) for the
    current `microbatches`; `state` and `inputs` may be abstract."""
    compiled = self._jit_step(inputs).lower(state, inputs).compile()
    memory = compiled.memory_analysis()
    return compiled, (memory.temp_size_in_bytes + memory.output_size_in_bytes
                      - memory.alias_size_in_bytes)

  def fit_microbatches(self, state, inputs, budget: int):
    """The step compiled with the fewest microbatches (the objective's,
    doubled while the batch divides) whose new buffers fit `budget` bytes
    per device; sets `microbatches`. A batch that fits in no split raises
    MemoryError with the figures."""
    batch = jax.tree.leaves(inputs)[0].shape[0]
    data = self.mesh.shape['data']
    tried = []
    count = self.microbatches
    while True:
      self.microbatches = count
      compiled, needed = self.step_memory(state, inputs)
      tried.append((count, needed))
      if needed <= budget:
        if count != self.objective.microbatches:
          log.info('batch %d split into %d microbatches to fit %.2f GiB '
                   'per device (%s)', batch, count, budget / 2**30,
                   _tried(tried))
        return compiled
      count *= 2
      if batch % (count * data):
        raise MemoryError(
            f'The step does not fit {budget / 2**30:.2f} GiB per device '
            f'in any split of the batch of {batch} over {data} '
            f'data-parallel devices ({_tried(tried)}): lower '
            'train.batch_size, or set BertConfig.remat.')

  def lower(self, abstract_inputs: dict):
    """The step lowered for a global batch of `jax.ShapeDtypeStruct`s (see
    `Objective.abstract_inputs`); nothing is allocated."""
    return self._jit_step(abstract_inputs).lower(self.abstract_state,
                                                 abstract_inputs)



def _tried(tried) -> str:
  return ', '.join(f'{count} microbatch(es): {needed / 2**30:.2f} GiB'
                   for count, needed in tried)


def memory_budget(mesh, fraction: float) -> int | None:
  """`fraction` of the memory the mesh's first local device has free now,
  in bytes; None where the device does not report it (CPUs)."""
  device = next(d for d in mesh.devices.flat
                if d.process_index == jax.process_index())
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if not stats or 'bytes_limit' not in stats:
    return None
  return int(fraction * (stats['bytes_limit'] - stats.get('bytes_in_use', 0)))


def held_out_metrics(run: RunKind, source: Source, preparer: InputPreparer,
                     evaluate, mesh, params, step: int, batch_size: int,
                     num_batches: int, seed: int = 0) -> dict:
  """The run's metrics on the first `num_batches` held-out batches (the
  same ones every time): the mean over batches of each batch's metrics,
  the input preparer's among them. `evaluate(params, inputs)` is the jitted
  deterministic loss' metrics (`Trainer.evaluate`)."""
  totals, count = {}, 0
  for examples in source.batches(
      run.task, run.eval_split, run.shapes, batch_size, seed=seed,
      shuffle=False, num_epochs=1):
    if count == num_batches:
      break
    inputs, host_metrics = preparer.prepare(examples, params, step)
    metrics = {**jax.device_get(evaluate(
        params, partitioning.global_batch(inputs, mesh))),
               # Not index_staleness where no index is read.
               **{k: v for k, v in host_metrics.items() if v is not None}}
    for name, value in metrics.items():
      totals[name] = totals.get(name, 0.0) + float(value)
    count += 1
  if not count:
    raise ValueError(f'No {run.eval_split} batch of {batch_size} in '
                     f'{run.task}.')
  return {name: value / count for name, value in totals.items()}


def _remove_if_refused(model_dir: str, error: BaseException | None) -> None:
  """A new model_dir whose run a user error stopped before its first
  update is removed (the lock, the format file, the config, the initial
  checkpoint and index: a data set found missing at the first batch comes
  after them), so that the corrected command starts as on a fresh
  directory, not as a resume bound to the refused run's settings."""
  if not isinstance(error, errors.UserError) or jax.process_index():
    return
  checkpoints = epath.Path(run_directory.checkpoints_dir(model_dir))
  trained = checkpoints.is_dir() and any(
      path.name.isdigit() and int(path.name) > 0
      for path in checkpoints.iterdir())
  if not trained:
    epath.Path(model_dir).rmtree(missing_ok=True)


@gin.configurable
def train(model_dir: str, source: Source, run: RunKind = gin.REQUIRED,
          num_steps: int = gin.REQUIRED, batch_size: int = gin.REQUIRED,
          seed: int = 0, checkpoint_every: int = 1000,
          keep_checkpoints: int = 3, keep_every: int | None = None,
          retriever_every: int | None = None,
          log_every: int = 10, eval_every: int | None = None, eval_batches: int = 10,
          eval_batch_size: int | None = None,
          data_shards: int | None = None, prefetch: bool = True,
          memory_fraction: float | None = 0.9,
          time_limit_s: float | None = None,
          record: dict | None = None) -> TrainState:
  """Trains `run` to `num_steps`, resuming from model_dir's newest checkpoint.

  Args:
    model_dir: checkpoints, metrics and (for retrieval runs) the index.
    source: where the run's examples come from (`run_loader.train` passes
      the configured one).
    run: Ict(), Pretrain() or Finetune().
    num_steps: the total number of updates of the run.
    batch_size: the global batch (each process feeds its share).
    seed: parameters, dropout and data order.
    checkpoint_every: steps between (asynchronous) checkpoints.
    keep_checkpoints: the newest ones kept (and as many retriever
      snapshots).
    keep_every: checkpoints at its multiples are kept besides (when saved:
      a multiple of checkpoint_every), to be scored after the run, along
      its training. None: the newest alone.
    retriever_every: steps between saves of the towers alone
      (model_dir/retriever_snapshots), which the index builder embeds as it
      does checkpoints: a refresh cadence shorter than the checkpoints' at a
      fraction of their bytes (no reader, no optimizer state). None: the
      builder embeds checkpoints alone.
    log_every: steps between metric writes.
    eval_every: steps between held-out evaluations (also at step 0); None
      for none.
    eval_batches / eval_batch_size: size of each evaluation.
    data_shards: disjoint shards the global batch is drawn from (default:
      one per process); fix it to keep the data order across host counts.
    prefetch: retrieve each batch during the step before it, with the
      parameters that step starts from (one update older; the scores the
      loss reads are still the current ones), so that the host's share of
      retrieval overlaps the device step. After a step that is saved the
      next batch is retrieved with the saved parameters, as a run resumed
      there does: resumes stay exact.
    memory_fraction: on devices that report their memory (GPUs, TPUs), the
      share of what is free at the first step that the step may allocate:
      a batch that needs more is split into more microbatches
      (`Trainer.fit_microbatches`). None compiles the step as configured.
    time_limit_s: seconds the run may take from its start, compiling
      included; once spent, the run ends at the step it reached (at least
      one more) as it would at num_steps
      (a checkpoint of that step, the index builder told it is done) and
      says so: a preset's stage that keeps to its share of a budget. A
      later run with more time resumes there.
    record: what the run records for its other readers
      (`run_loader.run_record`), written before its first checkpoint: an
      index builder that waited for checkpoints finds it.
  """
  started_at = time.perf_counter()
  distributed.initialize()
  model_dir = run_directory.absolute(model_dir)
  # One trainer per run directory, and only on a layout this code reads.
  with contextlib.ExitStack() as held:
    if '://' not in model_dir and not epath.Path(model_dir).exists():
      held.push(lambda unused_kind, error, unused_traceback:
                _remove_if_refused(model_dir, error))
    held.enter_context(run_guard.TrainerLock(model_dir))
    run_guard.check_format(model_dir)
    if jax.process_index() == 0:
      record_vocabulary(model_dir)
      if record is not None:
        run_directory.write_record(model_dir, record)
    mesh = partitioning.make_mesh()
    trainer = Trainer(run.objective, mesh, num_steps, seed)
    preparer = run.input_preparer(model_dir, mesh)
    # Closed however the run ends, before the lock goes.
    checkpoints = held.enter_context(Checkpoints(
        model_dir, checkpoint_every, keep_checkpoints, retriever_every,
        keep_every))
    data_shards = data_shards or jax.process_count()
    position = {'task': run.task, 'seed': seed, 'batch_size': batch_size,
                **source.position(run.task, data_shards)}
    resumed = checkpoints.restore_newest(trainer.abstract_state)
    warm_index = None
    if resumed is None:
      started = run.warm_start(trainer.fresh_params())
      state, warm_index = trainer.initial_state(started.params), started.index
      checkpoints.save(state, 0, {**position, 'batches': 0}, force=True)
      # Done before the run publishes its first index: two Orbax managers'
      # cross-process barriers must not interleave.
      checkpoints.wait()
    else:
      latest, state, saved = resumed
      _check_position(saved, position, checkpoints.directory, latest)
      log.info('resumed from step %d of %s', latest, checkpoints.directory)
    start = int(state.step)
    if memory_fraction is not None:
      # Measured with the state in place: what the step may add to it.
      trainer.memory_budget = memory_budget(mesh, memory_fraction)
    preparer.start(state.params, start, warm_index)
    if jax.process_index() == 0:
      drop_rows_after(metrics_path(model_dir), start)
    writer = create_writer(model_dir)
    if jax.process_index() == 0:
      # The operative config, for evaluation and serving to rebuild the run.
      run_directory.replace_whole(run_directory.config_path(model_dir),
                                  gin.operative_config_str())
    evaluate = lambda params, step: held_out_metrics(
        run, source, preparer, trainer.evaluate, mesh, params, step,
        eval_batch_size or batch_size, eval_batches, seed)
    if eval_every and start == 0:
      _write(writer, 0, evaluate(state.params, 0), 'eval/')
    data = source.batches(run.task, 'train', run.shapes, batch_size,
                          seed=seed, skip_batches=start,
                          data_shards=data_shards)
    progress = Progress('train', num_steps, unit='steps', every_s=10,
                        done=start, also=(batch_size, 'examples'))
    window, window_start = [], time.perf_counter()
    ready = None  # This step's (inputs, host metrics), when prefetched.
    deadline = None if time_limit_s is None else started_at + time_limit_s
    for step in range(start + 1, num_steps + 1):
      # Process 0's clock decides: the last step's save is collective.
      last = step == num_steps or (deadline is not None and bool(
          distributed.agree(int(time.perf_counter() >= deadline))))
      started = time.perf_counter()
      if ready is None:
        ready = preparer.prepare(next(data), state.params, step - 1)
      inputs, host_metrics = ready
      # The next batch's device work is queued before this step (with the
      # parameters it starts from, before they are donated to it); its host
      # work runs while the device steps.
      ahead = prefetch and not last and not checkpoints.due(step)
      host_part = ahead and preparer.dispatch_prepare(next(data), state.params,
                                                      step)
      prepared = time.perf_counter()
      state, metrics = trainer.step(state, inputs)
      ready = host_part() if host_part else None
      metrics = {**jax.device_get(metrics), **host_metrics,
                 # The loop's own work before the step (this batch's inputs
                 # unless prefetched, the next one's device work) vs the step.
                 'prepare_seconds': prepared - started,
                 'step_seconds': time.perf_counter() - prepared}
      if not math.isfinite(float(metrics['loss'])):
        checkpoints.wait()  # The last good one, finished.
        raise FloatingPointError(
            f'Loss is {float(metrics["loss"])} at step {step}; the last good '
            f'checkpoint is step {checkpoints.latest_step()} in '
            f'{checkpoints.directory}.')
      # Rows before the save: a row past the newest checkpoint is dropped on
      # resume, and none is missing.
      window.append(metrics)
      if step % log_every == 0 or last:
        elapsed = time.perf_counter() - window_start
        summary = {k: float(np.mean([m[k] for m in window])) for k in window[0]
                   if all(m[k] is not None for m in window)}
        summary['steps_per_second'] = len(window) / elapsed
        summary['examples_per_second'] = len(window) * batch_size / elapsed
        _write(writer, step, summary)
        window, window_start = [], time.perf_counter()
      if eval_every and step % eval_every == 0:
        _write(writer, step, evaluate(state.params, step), 'eval/')
      checkpoints.save(state, step, {**position, 'batches': step},
                       force=last)
      progress.update(1)
      if last:
        if step < num_steps:
          log.warning('train.time_limit_s=%s spent: the run ends at step %d '
                      'of %d (checkpointed; a later run resumes there).',
                      time_limit_s, step, num_steps)
        break
    checkpoints.wait()
    checkpoints.close()
    writer.close()
    preparer.finish()  # First: the index builder must stop whatever follows.
    if jax.process_index() == 0:
      try:
        plot_curves(metrics_path(model_dir),
                    os.path.join(model_dir, 'train_curves.png'))
      except (ValueError, OSError) as error:
        log.warning('No training-curves plot: %s', error)
    return state


def _write(writer, step: int, metrics: dict, prefix: str = '') -> None:
  writer.write_scalars(step, {prefix + k: v for k, v in metrics.items()})
  writer.flush()


def _check_position(saved: dict, expected: dict, directory: str, step: int):
  """A resumed run must read the same data in the same order."""
  changed = {k: (saved.get(k), v) for k, v in expected.items()
             if saved.get(k) != v}
  if changed:
    raise errors.BadConfig(
        f'Checkpoint {step} in {directory} was trained with a different data '
        'order: ' + ', '.join(f'{k} {old!r} -> {new!r}'
                              for k, (old, new) in changed.items())
        + '. Use a new model_dir, or the old settings.')
