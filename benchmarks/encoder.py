"""BERT forward throughput, ours against Hugging Face transformers' PyTorch
BERT on the same weights, batch, sequence length and threads (CPU).

MiniLM-L6 is the embedded sentence-transformers checkpoint; BERT-base is a
randomly initialized `transformers.BertModel` saved as safetensors, which
both sides then load (its speed does not depend on the values). The inputs
are random wordpieces with no padding. Each side is warmed up, then the two
alternate call by call, so drifts in the machine hit both alike; the median
call time is reported, and `time_ratio` is ours / theirs (below 1: we are
faster). A first row times the float32 GEMM under each, a 2048^3 matmul. `max_abs_diff` of the two outputs shows they computed the same
function.
"""

import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks import peak
from realm_jax.models import flops

MODELS = ('minilm-l6', 'bert-base')
LENGTHS = (128, 288)


def _bert_base_dir(directory: str) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig()).save_pretrained(directory)
  return directory


def _ours(directory: str):
  """(config, forward(token_ids, mask) -> [B, L, H] numpy)."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models import pretrained  # pylint: disable=g-import-not-at-top
  from realm_jax.models.bert import Bert  # pylint: disable=g-import-not-at-top
  config = pretrained.config_from_hf(os.path.join(directory, 'config.json'))
  params = pretrained.load_bert_params(directory, config)
  model = Bert(config)
  apply = jax.jit(lambda p, ids, mask: model.apply(
      {'params': p}, ids, mask).sequence_output)
  return config, lambda ids, mask: np.asarray(apply(params, ids, mask))


def _theirs(directory: str, threads: int):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  transformers.utils.logging.disable_progress_bar()
  model = transformers.BertModel.from_pretrained(directory).eval()

  def forward(ids, mask):
    with torch.inference_mode():
      return model(input_ids=torch.from_numpy(ids),
                   attention_mask=torch.from_numpy(mask)
                   ).last_hidden_state.numpy()
  return forward


def _seconds(fn, *args) -> float:
  start = time.perf_counter()
  fn(*args)
  return time.perf_counter() - start


def _compare(name: str, directory: str, lengths, batch: int, calls: int,
             threads: int) -> list[dict]:
  config, ours = _ours(directory)
  try:
    theirs = _theirs(directory, threads)
  except ImportError as error:
    theirs, skipped = None, f'{error.name} not installed'
  rows = []
  rng = np.random.default_rng(0)
  for length in lengths:
    ids = rng.integers(1000, config.vocab_size, (batch, length), np.int64)
    mask = np.ones_like(ids)
    row = {'benchmark': 'encoder', 'model': name, 'length': length,
           'batch': batch, 'threads': threads}
    out = ours(ids, mask)  # Compiles.
    if theirs is None:
      times = [_seconds(ours, ids, mask) for _ in range(calls)]
      rows.append({**row, 'ours_seq_per_s': batch / statistics.median(times),
                   'skipped_theirs': skipped})
      continue
    diff = float(np.max(np.abs(out - theirs(ids, mask))))
    times = {'ours': [], 'theirs': []}
    for _ in range(calls):
      times['ours'].append(_seconds(ours, ids, mask))
      times['theirs'].append(_seconds(theirs, ids, mask))
    ours_s, theirs_s = (statistics.median(times[k]) for k in times)
    rows.append({
        **row, 'ours_seq_per_s': batch / ours_s,
        'theirs_seq_per_s': batch / theirs_s, 'time_ratio': ours_s / theirs_s,
        'ours_gflop_per_s': batch * flops.encoder_forward(config, length)
                            / ours_s / 1e9,
        'max_abs_diff': diff})
  return rows


def _matmul_row(threads: int, size: int = 2048, calls: int = 7) -> dict:
  """The GEMM under both: a float32 size^3 matmul in JAX and in PyTorch."""
  row = {'benchmark': 'encoder', 'model': f'matmul {size}^3 float32',
         'threads': threads,
         'ours_gflop_per_s': peak.measured_matmul(size=size, calls=calls) / 1e9}
  theirs = peak.torch_matmul('float32', size, calls)
  if not theirs:
    return {**row, 'skipped_theirs': 'torch not installed'}
  return {**row, 'theirs_gflop_per_s': theirs['PyTorch'] / 1e9,
          'time_ratio': theirs['PyTorch'] / 1e9 / row['ours_gflop_per_s']}


def run(options) -> list[dict]:
  quick = options.quick
  from realm_jax import embedded  # pylint: disable=g-import-not-at-top
  threads = os.cpu_count()
  if quick:
    return _compare('minilm-l6', embedded.minilm_dir(), (128,), batch=8,
                    calls=3, threads=threads)
  rows = [_matmul_row(threads)]
  rows += _compare('minilm-l6', embedded.minilm_dir(), LENGTHS, batch=32,
                   calls=7, threads=threads)
  with tempfile.TemporaryDirectory() as directory:
    try:
      _bert_base_dir(directory)
    except ImportError as error:
      return rows + [{'benchmark': 'encoder', 'model': 'bert-base',
                      'skipped': f'{error.name} not installed'}]
    rows += _compare('bert-base', directory, LENGTHS, batch=8, calls=5,
                     threads=threads)
  return rows
