"""The trainer and the index builder on one small host: how to split its
cores between them.

REALM's builder re-embeds the corpus while the trainer steps, and on a
laptop or a 2-core CI machine both are XLA programs that want every core.
Each placement below starts the two as separate processes (as
`realm-jax launch` does), pinned with CPU affinity, lets both compile, then
releases them together and counts, over the same window, the trainer's
steps (the demo's pre-training step) and the builder's blocks (its own
`DocumentEmbedder`, the demo's 2-layer tower at 64 wordpieces). The rows
alone are each side's rate with the host to itself.

  python -m benchmarks.run --only sharing
"""

import json
import os
import subprocess
import sys
import time

DEMO_BLOCKS = 10_054  # The embedded default corpus: one refresh.
BUILDER_BATCH = 64


def _trainer_work():
  """One call = one demo pre-training step; returns the steps done (1)."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  trainer, state, inputs, _ = train_step.build(
      'pretrain', 'minilm-l6', 8, 'float32', train_step.DEMO_BINDINGS)
  box = [state]

  def work() -> int:
    box[0], metrics = trainer.step(box[0], inputs)
    jax.block_until_ready(metrics)
    return 1
  return work


def _builder_work():
  """One call = ten batches of blocks embedded; returns the blocks done."""
  import gin  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks.train_step import GIN_DIR  # pylint: disable=g-import-not-at-top
  from realm_jax.index.embed import DocumentEmbedder  # pylint: disable=g-import-not-at-top
  from realm_jax.models.realm import model_retriever  # pylint: disable=g-import-not-at-top
  gin.parse_config_files_and_bindings([f'{GIN_DIR}/models/minilm_l6.gin'],
                                      ['BertConfig.num_layers = 2'])
  retriever = model_retriever()
  tokens = lambda *shape: {k: jnp.ones(shape, jnp.int32) for k in
                           ('token_ids', 'input_mask', 'token_type_ids')}
  params = retriever.init(jax.random.PRNGKey(0), tokens(1, 8),
                          tokens(1, 1, 8))['params']
  embedder = DocumentEmbedder(retriever, BUILDER_BATCH, jax.devices()[:1])
  shape = (10 * BUILDER_BATCH, 64)
  arrays = {'token_ids': np.random.default_rng(0).integers(
                1000, retriever.config.vocab_size, shape, dtype=np.int32),
            'input_mask': np.ones(shape, np.int32),
            'token_type_ids': np.zeros(shape, np.int32)}

  def work() -> int:
    embedder(params, arrays)
    return shape[0]
  return work


def child(role: str, window: float) -> None:
  """Compiles, says 'ready', waits for a line on stdin, then works for
  `window` seconds and prints its rate: units done over the time they
  took (the last unit may end after the window)."""
  work = {'trainer': _trainer_work, 'builder': _builder_work}[role]()
  work()  # Compiles.
  print('ready', flush=True)
  sys.stdin.readline()
  start = time.perf_counter()
  done = 0
  while time.perf_counter() - start < window:
    done += work()
  print(json.dumps({'rate': done / (time.perf_counter() - start)}),
        flush=True)


def _placements(cpus: list[int]) -> list[tuple[str, list | None, list | None]]:
  """(name, trainer cores, builder cores); None: that side does not run."""
  last = cpus[-1:]
  return [('trainer alone', cpus, None), ('builder alone', None, cpus),
          ('shared: both on every core', cpus, cpus),
          (f'builder pinned to core {last[0]}', cpus, last),
          (f'split: trainer on {len(cpus) - 1}, builder on 1', cpus[:-1], last)]


def measure(name: str, trainer_cpus, builder_cpus, window: float) -> dict:
  processes = {}
  for role, cpus in (('trainer', trainer_cpus), ('builder', builder_cpus)):
    if cpus is not None:
      processes[role] = subprocess.Popen(
          [sys.executable, '-m', 'benchmarks.sharing', role, str(window),
           ','.join(map(str, cpus))],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  for role, process in processes.items():
    if process.stdout.readline().strip() != 'ready':
      raise RuntimeError(f'the {role} of "{name}" failed before its window '
                         f'(exit {process.wait()}).')
  for process in processes.values():  # Released together.
    process.stdin.write('go\n')
    process.stdin.flush()
  rates = {role: json.loads(process.stdout.readline())['rate']
           for role, process in processes.items()}
  for process in processes.values():
    process.wait()
  row = {'benchmark': 'sharing', 'placement': name,
         'trainer_cores': len(trainer_cpus or ()),
         'builder_cores': len(builder_cpus or ()), 'window_s': window}
  if 'trainer' in rates:
    row['trainer_steps_per_s'] = rates['trainer']
  if 'builder' in rates:
    row['builder_docs_per_s'] = rates['builder']
    row['demo_refresh_s'] = DEMO_BLOCKS / rates['builder']
  return row


def run(options) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top
  cpus = sorted(os.sched_getaffinity(0))
  if jax.devices()[0].platform != 'cpu' or len(cpus) < 2:
    return [{'benchmark': 'sharing',
             'skipped': 'needs a CPU host with 2 or more cores'}]
  if options.quick:  # Both sides start, meet and report: a smoke run.
    return [measure(*_placements(cpus)[2], window=3.0)]
  rows = [measure(name, t, b, 60.0) for name, t, b in _placements(cpus)]
  alone = {k: rows[i][k] for i, k in ((0, 'trainer_steps_per_s'),
                                      (1, 'builder_docs_per_s'))}
  for row in rows[2:]:  # Each side's share of its rate alone.
    row['trainer_share'] = row['trainer_steps_per_s'] / alone[
        'trainer_steps_per_s']
    row['builder_share'] = row['builder_docs_per_s'] / alone[
        'builder_docs_per_s']
  return rows


if __name__ == '__main__':
  # Pinned before XLA starts, which sizes its thread pools to the cores seen.
  os.sched_setaffinity(0, [int(cpu) for cpu in sys.argv[3].split(',')])
  child(sys.argv[1], float(sys.argv[2]))
