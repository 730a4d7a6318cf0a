"""What a save for the index builder costs: a whole checkpoint against a
retriever snapshot (`train.retriever_every`).

The state is the REALM pre-training state of MiniLM-L6 at full depth (the
GPU preset's towers and reader, the towers shared as the released code
shares them), saved through `training.checkpoints.Checkpoints` as the
trainer saves it. Two times per save, medians of `REPEATS`:
- `blocked_s`: `save` returning, the time the training loop stands still
  (Orbax's copy of the arrays to the host, and the directory work);
- `write_s`: the write in the background after it. A save every N steps
  holds the loop up by the part of it longer than N steps, since each save
  waits for the one before.

  python -m benchmarks.run --only saves
"""

import statistics
import tempfile
import time

import jax

from benchmarks import train_step

REPEATS = 5
MODES = ('checkpoint', 'retriever snapshot')


def _times(state, mode: str, repeats: int) -> tuple[list, list]:
  """(blocked, write) seconds of `repeats` saves of `state` in `mode`."""
  from realm_jax.training.checkpoints import Checkpoints  # pylint: disable=g-import-not-at-top
  blocked, write = [], []
  with tempfile.TemporaryDirectory() as model_dir:
    snapshots = mode == 'retriever snapshot'
    checkpoints = Checkpoints(model_dir, 10 ** 9 if snapshots else 1, keep=3,
                              retriever_every=1 if snapshots else None)
    for step in range(1, repeats + 1):
      start = time.perf_counter()
      assert checkpoints.save(state, step, {'batches': step})
      returned = time.perf_counter()
      checkpoints.wait()
      blocked.append(returned - start)
      write.append(time.perf_counter() - returned)
    checkpoints.close()
  return blocked, write


def _gib(tree) -> float:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)) / 2**30


def accelerator(options) -> list[dict]:
  """`run`'s rows on the accelerator, named with its device and compiler:
  the copy off the device is part of what `save` holds the loop for."""
  from benchmarks.encoder import versions  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0].device_kind
  return [{**row, 'device': device, 'compiler': versions()}
          for row in run(options)]


def run(options) -> list[dict]:
  """A row per kind of save (`options.quick`: the demo's 2 layers, once)."""
  bindings = list(train_step.DEMO_BINDINGS)
  repeats = REPEATS
  if options.quick:
    repeats = 1
  else:  # The GPU preset's depth: the bytes a save writes.
    bindings.remove('BertConfig.num_layers = 2')
  _, state, _, _ = train_step.build('pretrain', 'minilm-l6', 8, 'float32',
                                    bindings)
  sizes = {'checkpoint': _gib((state.params, state.opt_state)),
           'retriever snapshot': _gib(state.params['retriever'])}
  rows = []
  for mode in MODES:
    blocked, write = _times(state, mode, repeats)
    rows.append({'benchmark': 'saves', 'saved': mode,
                 'gib_per_save': round(sizes[mode], 3), 'repeats': repeats,
                 'blocked_s': round(statistics.median(blocked), 4),
                 'write_s': round(statistics.median(write), 4)})
  return rows
