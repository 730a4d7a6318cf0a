"""Corpus embedding, the index builder's cost: docs/s, utilisation, and what
one refresh of the paper's 13,353,718 blocks takes on one chip and on 16.

The builder's own `DocumentEmbedder` runs the document tower over full
288-wordpiece blocks (the paper's blocks are nearly all full; the embedded
Wikipedia leads average 106, see docs/benchmarks.md) with random wordpieces.
The projections assume the rate scales linearly with chips, which holds for
embedding (no communication until the gather of the results).

`accelerator` (benchmarks/run.py --accelerator): BERT-base and MiniLM-L6
at 288 wordpieces in bfloat16 under the platform's gin setup
(gin/setups/gpu.gin on GPUs), the rate the median of a few passes.
"""

import os
import statistics
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from realm_jax.models import flops
from benchmarks.train_step import GIN_DIR, MODELS, setup_file

PAPER_BLOCKS = 13_353_718
BLOCK_LENGTH = 288


def measure(model: str, batch_size: int, num_blocks: int, dtype: str,
            setups=(), passes: int = 1) -> dict:
  """One row: `num_blocks` random blocks embedded in batches of
  `batch_size` after a compiling batch; the rate of the median of
  `passes` passes. `setups`: gin files layered after the model's."""
  from realm_jax.index.embed import DocumentEmbedder  # pylint: disable=g-import-not-at-top
  from realm_jax.models.realm import model_retriever  # pylint: disable=g-import-not-at-top
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  run_loader.configure(
      [f'{GIN_DIR}/models/{MODELS[model]}.gin', *setups],
      [f"BertConfig.dtype = '{dtype}'"])
  retriever = model_retriever()
  gin.clear_config()
  tokens = lambda *shape: {k: jnp.ones(shape, jnp.int32) for k in
                           ('token_ids', 'input_mask', 'token_type_ids')}
  params = retriever.init(jax.random.PRNGKey(0), tokens(1, 8),
                          tokens(1, 1, 8))['params']
  devices = jax.devices()
  devices = devices[:1] if devices[0].platform == 'cpu' else devices
  embedder = DocumentEmbedder(retriever, batch_size, devices)
  rng = np.random.default_rng(0)
  shape = (num_blocks, BLOCK_LENGTH)
  arrays = {'token_ids': rng.integers(1000, retriever.config.vocab_size, shape,
                                      dtype=np.int32),
            'input_mask': np.ones(shape, np.int32),
            'token_type_ids': np.zeros(shape, np.int32)}
  start = time.perf_counter()
  embedder(params, {k: v[:batch_size] for k, v in arrays.items()})  # Compiles.
  first_batch_s = time.perf_counter() - start
  seconds = []
  for _ in range(passes):
    start = time.perf_counter()
    embedder(params, arrays)
    seconds.append(time.perf_counter() - start)
  docs_per_s = num_blocks / statistics.median(seconds)
  device_peak, source = peak.device_peak(jnp.dtype(dtype))
  per_doc = flops.tower(retriever.config, BLOCK_LENGTH,
                        retriever.projection_size)
  refresh_seconds = PAPER_BLOCKS / docs_per_s * len(devices)  # One chip.
  return {'benchmark': 'embed', 'model': model, 'dtype': dtype,
          'batch': batch_size, 'blocks': num_blocks, 'length': BLOCK_LENGTH,
          'devices': len(devices), 'docs_per_s': docs_per_s,
          'gflop_per_doc': per_doc / 1e9,
          'mfu': docs_per_s * per_doc / (device_peak * len(devices)),
          'peak_source': source,
          'refresh_hours_1_chip': refresh_seconds / 3600,
          'refresh_minutes_16_chips': refresh_seconds / 16 / 60,
          'first_batch_s': first_batch_s}


def accelerator(options) -> list[dict]:
  """BERT-base and MiniLM-L6 over 288-wordpiece blocks in bfloat16 under
  the platform's setup (on one device: the rate per chip); --quick: the
  tiny model and MiniLM over a few blocks. A model starts only while the
  time left exceeds what the previous one took."""
  from benchmarks.encoder import versions  # pylint: disable=g-import-not-at-top
  from realm_jax.models import target  # pylint: disable=g-import-not-at-top
  time_left = getattr(options, 'time_left', lambda: float('inf'))
  device = jax.devices()[0]
  setups = [setup_file(target.platform_of([device]))]
  sizes = ({'tiny': (8, 16), 'minilm-l6': (8, 8)} if options.quick else
           {'bert-base': (256, 8192), 'minilm-l6': (512, 16384)})
  base = {'benchmark': 'embed', 'device': device.device_kind,
          'compiler': versions(), 'setup': os.path.relpath(
              setups[0], os.path.dirname(GIN_DIR))}
  rows, needed = [], 0.0
  for model, (batch, blocks) in sizes.items():
    if time_left() < needed:
      rows.append({**base, 'model': model, 'batch': batch,
                   'skipped': f'time budget: {time_left():.0f} s left, the '
                              f'last model took {needed:.0f}'})
      print(rows[-1], flush=True)
      continue
    start = time.perf_counter()
    try:
      rows.append({**base, **measure(model, batch, blocks, 'bfloat16',
                                     setups, passes=1 if options.quick else 3)})
    except Exception as error:  # pylint: disable=broad-except
      rows.append({**base, 'model': model, 'batch': batch,
                   'error': f'{type(error).__name__}: {str(error)[:300]}'})
    finally:
      gin.clear_config()
    print(rows[-1], flush=True)
    needed = time.perf_counter() - start
  return rows


def run(options) -> list[dict]:
  quick = options.quick
  on_cpu = jax.devices()[0].platform == 'cpu'
  dtype = 'float32' if on_cpu else 'bfloat16'
  if quick:
    return [measure('tiny', 16, 32, dtype)]
  sizes = ({'tiny': (64, 512), 'minilm-l6': (64, 128), 'bert-base': (16, 32)}
           if on_cpu else {'tiny': (1024, 32768), 'minilm-l6': (512, 16384),
                           'bert-base': (256, 8192)})
  return [measure(model, batch, blocks, dtype)
          for model, (batch, blocks) in sizes.items()]
