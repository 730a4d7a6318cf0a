"""The train step: examples/s and model FLOPs utilisation of REALM
pre-training and of ICT, for the tiny, MiniLM and BERT-base configs.

The step is the trainer's own (`Trainer.step`: forward, backward, AdamW),
built from gin/runs/<run>.gin and gin/models/<model>.gin at the paper's
shapes (query 96, blocks 288, reader 384, 8 candidates, 20 masked tokens;
ICT queries 64), fed random wordpieces. Retrieval is not in it: it runs on
the host before the step (docs/training.md measures its share). MFU is the
analytic model FLOPs (benchmarks/flops.py) per second over the peak of the
devices the step ran on (benchmarks/peak.py).

`accelerator` (benchmarks/run.py --accelerator): REALM pre-training with
BERT-base at the paper's shapes under the accelerator's gin setup
(gin/setups/gpu.gin: bfloat16, attention dropout 0, so attention takes the
fused kernel), at batch 8 and a larger batch where memory allows, the first
step (compile included) reported apart from the median step; batch 8 again
from the persistent compilation cache, and with the layers unrolled.
"""

import contextlib
import os
import statistics
import tempfile
import time
from unittest import mock

import gin
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from realm_jax.models import flops

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'gin')
MODELS = {'tiny': 'tiny', 'minilm-l6': 'minilm_l6', 'bert-base': 'bert_base'}
BLOCK_LENGTH = 288


def _inputs(abstract: dict, vocab_size: int, query_length: int, seed: int = 0):
  """Concrete arrays of `abstract`'s shapes: random wordpieces, full masks,
  masked positions inside the query."""
  rng = np.random.default_rng(seed)

  def fill(path, spec):
    name = path[-1].key
    if name in ('input_mask', 'candidate_mask', 'mlm_mask'):
      return np.ones(spec.shape, spec.dtype)
    if name == 'token_type_ids':
      return np.zeros(spec.shape, spec.dtype)
    if name == 'mlm_positions':
      return rng.integers(1, query_length - 1, spec.shape).astype(spec.dtype)
    return rng.integers(min(1000, vocab_size // 2), vocab_size,
                        spec.shape).astype(spec.dtype)
  return jax.tree_util.tree_map_with_path(fill, abstract)


def _model_flops(run, batch_size: int):
  """(analytic FLOPs of one training step of `run` on `batch_size` examples,
  the BertConfig whose vocabulary the inputs draw from)."""
  if type(run).__name__ == 'Ict':
    config = run.objective.retriever.config
    forward = flops.ict_example(
        config, run.objective.retriever.projection_size,
        run.shapes['query_token_ids'][0], run.shapes['block_token_ids'][0],
        batch_size)
  else:
    realm = run.objective.model
    forward = flops.pretrain_example(
        realm.retriever_config, realm.reader_config, realm.projection_size,
        run.shapes['query_token_ids'][0], run.block_length or BLOCK_LENGTH,
        realm.reader_length, run.objective.num_candidates,
        run.shapes['mlm_positions'][0])
    config = realm.reader_config
  return batch_size * flops.train(forward), config


# --quick's shapes: smaller than the paper's, a smoke run.
QUICK_BINDINGS = ('Pretrain.num_candidates = 2', 'Pretrain.query_length = 32',
                  'Pretrain.max_masked = 4', 'build_realm.reader_length = 96',
                  'Pretrain.block_length = 64', 'Ict.block_length = 64',
                  'Ict.query_length = 32')

# The demo's pre-training step (gin/setups/demo.gin), on the paper's run file.
DEMO_BINDINGS = ('BertConfig.num_layers = 2', 'Pretrain.num_candidates = 4',
                 'Pretrain.query_length = 48', 'Pretrain.max_masked = 10',
                 'Pretrain.block_length = 64',
                 'build_realm.reader_length = 112')


# The controlled world's REALM step (gin/setups/world.gin, the candidates
# of presets/_world.py), what its preset spends most of its minutes on.
WORLD_SETUP = os.path.join(GIN_DIR, 'setups/world.gin')
WORLD_BINDINGS = ('Pretrain.num_candidates = 8',)
WORLD_BATCH = 16


@contextlib.contextmanager
def world_vocabulary():
  """$REALM_VOCAB naming the world's own wordpieces while entered (its
  runs check their vocabulary against BertConfig.vocab_size)."""
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  from realm_jax.data import world  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {
      default_files.VOCAB_ENV: world.write_vocabulary(
          os.path.join(tmp, 'vocab.txt'))}):
    yield


def world_rows(steps: int = 20) -> list[dict]:
  """REALM's step, the frozen towers' and the baseline's (the null
  document alone) in the world, each `steps` times after its compile."""
  controls = {'pretrain (world)': (),
              'pretrain (world, frozen towers)': (
                  'Pretrain.train_retriever = False',),
              'pretrain (world, baseline)': ('Pretrain.num_candidates = 1',)}
  with world_vocabulary():
    return [measure('pretrain', 'tiny', WORLD_BATCH, steps, 'float32',
                    WORLD_BINDINGS + bindings, label, setups=(WORLD_SETUP,))
            for label, bindings in controls.items()]


# The gin setup of each accelerator platform, layered after the run and the
# model files in the accelerator mode.
SETUPS = {'gpu': 'setups/gpu.gin', 'tpu': 'setups/tpu_v4.gin',
          'cpu': 'setups/gpu.gin'}  # CPU: the smoke run of the GPU's.


def setup_file(platform: str) -> str:
  return os.path.join(GIN_DIR, SETUPS[platform])


def build(run_name: str, model: str, batch_size: int, dtype: str,
          bindings=(), setups=()):
  """(trainer, its initial state, random inputs, analytic FLOPs per step);
  the gin config stays bound for the step's first trace. `setups`: gin
  files layered after the run's and the model's."""
  from realm_jax.training import partitioning, run_loader  # pylint: disable=g-import-not-at-top
  from realm_jax.training.trainer import Trainer  # pylint: disable=g-import-not-at-top
  run_loader.configure(
      [f'{GIN_DIR}/runs/{run_name}.gin', f'{GIN_DIR}/models/{MODELS[model]}.gin',
       *setups],
      [f"{kind}.bert_dir = ''" for kind in ('Pretrain', 'Ict')]
      + ['bert_adamw.warmup_steps = 1', f"BertConfig.dtype = '{dtype}'",
         *bindings])
  run = run_loader.configured_run().run
  # One CPU device is the whole host; accelerators use all of theirs.
  devices = jax.devices()
  devices = devices[:1] if devices[0].platform == 'cpu' else devices
  trainer = Trainer(run.objective, partitioning.make_mesh(devices=devices),
                    num_steps=1000)
  step_flops, config = _model_flops(run, batch_size)
  inputs = _inputs(run.objective.abstract_inputs(
      batch_size, run.block_length or BLOCK_LENGTH),
                   config.vocab_size, run.shapes['query_token_ids'][0])
  return trainer, trainer.initial_state(), inputs, step_flops


def measure(run_name: str, model: str, batch_size: int, steps: int,
            dtype: str, bindings=(), label: str | None = None,
            setups=()) -> dict:
  """One row: the median step time of `steps` steps after a compiling one
  (`first_step_s`: that one, compile included)."""
  trainer, state, inputs, step_flops = build(run_name, model, batch_size,
                                             dtype, bindings, setups)
  start = time.perf_counter()
  state, metrics = trainer.step(state, inputs)  # Compiles.
  jax.block_until_ready(metrics)
  first_step_s = time.perf_counter() - start
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = trainer.step(state, inputs)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  gin.clear_config()
  seconds = statistics.median(times)
  devices = len(trainer.mesh.devices.flat)
  device_peak, source = peak.device_peak(jnp.dtype(dtype))
  return {'benchmark': 'train_step', 'run': label or run_name, 'model': model,
          'dtype': dtype, 'batch': batch_size, 'devices': devices,
          'step_seconds': seconds, 'examples_per_s': batch_size / seconds,
          'model_tflop_per_step': step_flops / 1e12,
          'mfu': step_flops / seconds / (device_peak * devices),
          'peak_tflop_per_s': device_peak * devices / 1e12,
          'peak_source': source, 'loss': float(metrics['loss']),
          'first_step_s': first_step_s}


def _memory_limit() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('bytes_limit')


# The GPU rows: the largest batch first, each layer rematerialized (as
# gin/setups/paper_scale.gin and tpu_v4.gin run BERT-base), where the card
# holds it at the goal of 1 GiB of activations an example; then batch 8 as
# the GPU setup runs it, keeping every activation; that step again from the persistent compilation cache;
# and with the layers unrolled (`BertConfig.scan_unroll`), the lever against
# the scan's copies of its stacked buffers (docs/benchmarks.md). Last, while
# time is left, the largest batch without remat the card holds (XLA:GPU's
# compile for an H100 asks 44.5 GiB of temporaries at 32, docs/results/
# compiled_kernels_h100.json; before the LayerNorms and the GELU were
# recomputed an H100 was asked 110 GiB): no recompute, the MFU goal's other
# candidate.
LARGE_BATCH = 64
ACTIVATION_GOAL = 2 ** 30
NO_REMAT_BATCH = 32
# An example's bytes at NO_REMAT_BATCH without remat and with the layers
# unrolled, the weights' share included (XLA:GPU's compile for an H100:
# 54.4 GiB of temporaries and 2.4 of arguments at batch 32).
NO_REMAT_BYTES = 1.8 * 2 ** 30


class _CacheEvents:
  """Counts JAX's persistent-cache hits and misses while it is entered."""

  EVENTS = {'/jax/compilation_cache/cache_hits': 'hits',
            '/jax/compilation_cache/cache_misses': 'misses'}

  def __init__(self):
    self.counts = {'hits': 0, 'misses': 0}

  def _listen(self, event, **_):
    if event in self.EVENTS:
      self.counts[self.EVENTS[event]] += 1

  def __enter__(self):
    jax.monitoring.register_event_listener(self._listen)
    return self.counts

  def __exit__(self, *_):
    jax.monitoring.unregister_event_listener(self._listen)


def accelerator(options) -> list[dict]:
  """REALM pre-training, BERT-base, the paper's shapes (query 96, blocks
  288, reader 384, 8 candidates), bfloat16 under the platform's setup: at
  LARGE_BATCH (16 where the device holds less than its activations at the
  goal) with remat 'full', then at batch 8 without remat; batch 8 again
  with a new trainer, which traces and lowers the step again and reads the
  executable from the persistent compilation cache (benchmarks/run.py
  turns it on; `first_step_s` is then the goal's first step from the
  cache, the process's start aside); then batch 8 with the layers unrolled;
  then NO_REMAT_BATCH without remat and with the layers unrolled (the
  form that moves the fewest bytes: the MFU goal's likeliest row), where
  the device holds it.
  Each row runs while the time left allows it (the longest row's time,
  scaled). A row's peak memory is the device's since the process began:
  kept where it rose in that row. --quick: the tiny model at the smoke
  shapes, batch 2, the same rows but the two large ones."""
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  time_left = getattr(options, 'time_left', lambda: float('inf'))
  device = jax.devices()[0]
  platform = target.platform_of([device])
  setups = [setup_file(platform)]
  limit = _memory_limit()
  if options.quick:
    model, layers, small, steps, bindings = 'tiny', 2, 2, 2, QUICK_BINDINGS
    rows_asked = []
  else:
    model, layers, small, steps, bindings = 'bert-base', 12, 8, 10, ()
    large = (LARGE_BATCH if limit and limit >= LARGE_BATCH * ACTIVATION_GOAL
             else 16)
    rows_asked = [(large, 'full', 1, False)]
  # (batch, remat, layers a trip of the scan, from the cache)
  rows_asked += [(small, 'none', 1, False), (small, 'none', 1, True),
                 (small, 'none', layers, False)]
  if not options.quick and limit and (
      limit >= NO_REMAT_BATCH * NO_REMAT_BYTES):
    rows_asked.append((NO_REMAT_BATCH, 'none', layers, False))
  from benchmarks.encoder import versions  # pylint: disable=g-import-not-at-top
  base = {'benchmark': 'train_step', 'device': device.device_kind,
          'compiler': versions(), 'run': 'pretrain', 'model': model,
          'setup': os.path.relpath(setups[0], os.path.dirname(GIN_DIR))}
  # The longest row so far, by whether its layers were unrolled.
  rows, longest, peak_before = [], {}, 0.0
  for batch, remat, unroll, cached in rows_asked:
    asked = {**base, 'batch': batch, 'remat': remat, 'scan_unroll': unroll,
             'compiled': 'from the cache' if cached else 'here'}
    unrolled = unroll > 1
    estimate = _row_estimate(longest, unrolled, cached)
    if time_left() < estimate:
      rows.append({**asked, 'skipped': f'time budget: {time_left():.0f} s '
                                       f'left, the row needs about '
                                       f'{estimate:.0f}'})
      print(rows[-1], flush=True)
      continue
    start = time.perf_counter()
    try:
      with _CacheEvents() as cache:
        row = measure('pretrain', model, batch, 2 if cached else steps,
                      'bfloat16', (*bindings, f"BertConfig.remat = '{remat}'",
                                   f'BertConfig.scan_unroll = {unroll}'),
                      setups=setups)
    except Exception as error:  # pylint: disable=broad-except
      gin.clear_config()
      rows.append({**asked, 'error': f'{type(error).__name__}: '
                                     f'{str(error)[:300]}'})
      print(rows[-1], flush=True)
      continue
    peak = (device.memory_stats() or {}).get('peak_bytes_in_use', 0) / 2 ** 30
    rows.append({**asked, **row, 'step_ms': row['step_seconds'] * 1e3,
                 'cache_hits': cache['hits'], 'cache_misses': cache['misses'],
                 'peak_memory_gib': peak if peak > peak_before else None})
    peak_before = max(peak, peak_before)
    print(rows[-1], flush=True)
    longest[unrolled] = max(longest.get(unrolled, 0.0),
                            time.perf_counter() - start)
  return rows


def _row_estimate(longest: dict, unrolled: bool, cached: bool) -> float:
  """Seconds a train-step row will take, from the longest row of its form
  so far (`longest`: unrolled or not -> seconds): each row compiles again
  but the one from the cache. The unrolled step's first compile took 2.3x
  the scanned one's on an H100; after it, an unrolled row is like it."""
  if cached:
    return 0.5 * longest.get(False, 0.0)
  if longest.get(unrolled):
    return 1.3 * longest[unrolled]
  return (2.6 if unrolled else 1.3) * max(longest.values(), default=0.0)


def run(options) -> list[dict]:
  quick = options.quick
  on_cpu = jax.devices()[0].platform == 'cpu'
  dtype = 'float32' if on_cpu else 'bfloat16'
  if quick:  # Smaller shapes than the paper's: a smoke run.
    return [measure(r, 'tiny', 4, 2, dtype, QUICK_BINDINGS)
            for r in ('pretrain', 'ict')]
  # Batches a 2-core host finishes in seconds; accelerators take the
  # paper's per-chip share or more.
  batches = ({'tiny': 8, 'minilm-l6': 2, 'bert-base': 1} if on_cpu else
             {'tiny': 64, 'minilm-l6': 32, 'bert-base': 8})
  rows = [measure(r, model, batch * (16 if r == 'ict' else 1), 3, dtype)
          for model, batch in batches.items() for r in ('pretrain', 'ict')]
  if on_cpu:  # The steps `make demo` and the world spend their minutes on.
    rows.append(measure('pretrain', 'minilm-l6', 8, 5, dtype, DEMO_BINDINGS,
                        label='pretrain (demo)'))
    rows += world_rows()
  return rows
