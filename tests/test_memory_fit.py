"""The trainer splits a batch that does not fit into more microbatches,
by XLA's memory analysis of the compiled step, instead of refusing it."""

import jax
import numpy as np
import pytest

from realm_jax.input.seqio_source import SeqioSource
from realm_jax.training import partitioning, run_kinds
from realm_jax.training.trainer import Trainer
from tests.helpers import bind_tiny

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 8


@pytest.fixture(scope='module')
def prepared(tmp_path_factory, small_corpus):
  """A tiny pre-training trainer on 2 devices, its state and one batch."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('REALM_CORPUS_DIR', small_corpus)
    return _prepare(tmp_path_factory)


def _prepare(tmp_path_factory):
  bind_tiny()
  run = run_kinds.Pretrain(num_candidates=4, query_length=32, bert_dir='')
  trainer = Trainer(run.objective,
                    partitioning.make_mesh(devices=jax.devices()[:2]), 10)
  state = trainer.initial_state()
  preparer = run.input_preparer(str(tmp_path_factory.mktemp('run')),
                                trainer.mesh)
  preparer.start(state.params, 0)
  examples = next(SeqioSource().batches(run.task, 'train', run.shapes,
                                         BATCH))
  inputs, _ = preparer.prepare(examples, state.params, 0)
  return trainer, state, partitioning.global_batch(inputs, trainer.mesh)


def _needs(trainer, state, inputs, count):
  trainer.microbatches = count
  return trainer.step_memory(state, inputs)[1]


def test_a_budget_between_two_splits_takes_the_smaller_split_and_trains(
    prepared):
  trainer, state, inputs = prepared
  needs = {m: _needs(trainer, state, inputs, m) for m in (1, 2)}
  # Slices of the batch hold fewer activations at a time.
  assert needs[1] > needs[2], needs
  trainer.microbatches = 1
  fitted = trainer.fit_microbatches(state, inputs, (needs[1] + needs[2]) // 2)
  assert trainer.microbatches == 2
  new_state, metrics = fitted(jax.tree.map(lambda x: x.copy(), state), inputs)
  assert int(new_state.step) == 1 and np.isfinite(float(metrics['loss']))


def test_a_batch_no_split_fits_is_a_clear_error(prepared):
  """8 rows over 2 devices split at most 4 ways."""
  trainer, state, inputs = prepared
  trainer.microbatches = 4
  with pytest.raises(MemoryError, match=r'does not fit 0\.00 GiB per device '
                     r'in any split of the batch of 8 over 2'):
    trainer.fit_microbatches(state, inputs, 1)
