"""Mixed precision against float32 on the demo's REALM pre-training step.

  python -m benchmarks.precision [--repeats N]

The step is the trainer's own (forward, backward, AdamW) as `make demo`
pre-trains: gin/runs/pretrain.gin under gin/setups/demo.gin, batch 8, both
BERTs and the towers MiniLM-L6 cut to 2 layers, fed random wordpieces
(retrieval runs on the host before the step), in float32 (the demo's,
cpu_demo.gin) and under the policy of gin/setups/bf16.gin, the compute
dtype bound over the setup. Both start from
the same state, so their first losses differ by the precision alone. The
steps of the two alternate, so a load beside the benchmark slows both alike.
Writes benchmarks/results/precision.json. A CPU benchmark, for the demo's
choice (it runs where the demo does); on accelerators `benchmarks.run`'s
train step runs in bfloat16.
"""

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.run import RESULTS_DIR, table
from benchmarks.train_step import _inputs
from realm_jax.models import flops

POLICIES = {'float32': ["BertConfig.dtype = 'float32'"],
            'bfloat16': ["BertConfig.dtype = 'bfloat16'"]}
BATCH_SIZE = 8  # realm_jax/experiments/demo.py's pre-training batch.


def build(policy, params=None):
  """(trainer, its state from `params` (default: MiniLM warm-started), the
  inputs, the warm-started parameters as numpy), each step compiled under
  its own gin config."""
  from realm_jax.training import partitioning, run_loader  # pylint: disable=g-import-not-at-top
  from realm_jax.training.trainer import Trainer  # pylint: disable=g-import-not-at-top
  run_loader.configure(['gin/runs/pretrain.gin', 'gin/setups/demo.gin'],
                       [f'train.batch_size = {BATCH_SIZE}',
                        'bert_adamw.warmup_steps = 1', *policy])
  run = run_loader.configured_run().run
  trainer = Trainer(run.objective,
                    partitioning.make_mesh(devices=jax.devices()[:1]),
                    num_steps=1000)
  if params is None:
    params = jax.device_get(run.warm_start(trainer.fresh_params()).params)
  model = run.objective.model
  inputs = _inputs(run.objective.abstract_inputs(BATCH_SIZE, run.block_length),
                   model.reader_config.vocab_size,
                   run.shapes['query_token_ids'][0])
  return trainer, trainer.initial_state(params), inputs, params


def measure(repeats: int) -> list[dict]:
  """One row per policy: the median step time of `repeats` steps after the
  compiling one, and the loss of that first step (the shared state's)."""
  runs, params = {}, None
  for name, policy in POLICIES.items():
    trainer, state, inputs, params = build(policy, params)
    state, metrics = trainer.step(state, inputs)  # Compiles.
    runs[name] = {'trainer': trainer, 'state': state, 'inputs': inputs,
                  'loss': float(metrics['loss']), 'times': [],
                  'dtype': trainer.objective.model.reader_config.dtype.name}
  for _ in range(repeats):
    for run in runs.values():
      start = time.perf_counter()
      run['state'], metrics = run['trainer'].step(run['state'], run['inputs'])
      jax.block_until_ready(metrics)
      run['times'].append(time.perf_counter() - start)
  base = runs['float32']
  return [{'benchmark': 'precision', 'policy': name, 'dtype': run['dtype'],
           'batch': BATCH_SIZE, 'repeats': repeats,
           'step_seconds': statistics.median(run['times']),
           'min_seconds': min(run['times']),
           'max_seconds': max(run['times']),
           'time_vs_float32': (statistics.median(run['times'])
                               / statistics.median(base['times'])),
           'loss': run['loss'],
           'loss_rel_diff': abs(run['loss'] - base['loss']) / abs(base['loss'])}
          for name, run in runs.items()]


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.precision',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('--repeats', type=int, default=10)
  parser.add_argument('--output', default=os.path.join(RESULTS_DIR,
                                                       'precision.json'))
  args = parser.parse_args(argv)
  from realm_jax.experiments import machine as machine_lib  # pylint: disable=g-import-not-at-top
  machine = {**machine_lib.machine(), 'device_kind': jax.devices()[0].device_kind,
             'jax': jax.__version__,
             'matmul_2048_bf16_f32acc_gflops': flops.measured_matmul(
                 jnp.bfloat16, accumulate=jnp.float32) / 1e9}
  rows = measure(args.repeats)
  print('\n'.join(f'{k}: {v:.4g}' if isinstance(v, float) else f'{k}: {v}'
                  for k, v in machine.items()))
  print(table(rows), flush=True)
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, 'w', encoding='utf-8') as f:
    json.dump({'machine': machine, 'rows': rows}, f, indent=2)
  print(f'wrote {args.output}')
  return args.output


if __name__ == '__main__':
  main()
