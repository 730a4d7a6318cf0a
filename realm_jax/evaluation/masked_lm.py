"""Held-out masked salient-span accuracy of a pre-training run.

The paper's pre-training claim at small scale: the same reader, with and
without retrieved documents. Layer `Pretrain.num_candidates = 1` over the
run's config to read the null document alone (no retrieval).
"""

import json

import jax
from etils import epath

from realm_jax.evaluation.prediction import RestoredRun
from realm_jax.training import run_kinds
from realm_jax.training.trainer import held_out_metrics


def evaluate(model_dir: str, output_dir: str, name: str = 'masked_lm',
             gin_files=(), gin_bindings=(), batch_size: int = 8,
             num_batches: int = 1000, step: int | None = None) -> dict:
  """Mean held-out metrics over up to `num_batches` validation batches with
  the index of the evaluated step; written to output_dir/<name>_metrics.json."""
  restored = RestoredRun(model_dir, run_kinds.Pretrain, step, gin_files,
                         gin_bindings)
  run = restored.run
  if 'reader' not in restored.params:
    raise ValueError(f'{model_dir} has no reader: not a pre-training run.')
  run.retrieval.index_at(restored.step, run.retriever,
                         restored.params['retriever'])
  rng = jax.random.PRNGKey(0)
  metrics = held_out_metrics(
      run, jax.jit(lambda p, x: run.loss(p, x, rng, True)[1]), run.mesh,
      restored.params, restored.step, batch_size, num_batches)
  summary = {'model_dir': model_dir, 'step': restored.step,
             'index_step': run.retrieval.client.index_step,
             'num_candidates': run.num_candidates, **metrics}
  output = epath.Path(output_dir)
  output.mkdir(parents=True, exist_ok=True)
  (output / f'{name}_metrics.json').write_text(json.dumps(summary, indent=2))
  return summary
