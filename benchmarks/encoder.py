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

`accelerator` (benchmarks/run.py --accelerator): the same comparison on one
accelerator in bfloat16, both sides' weights and inputs on the device
(ours placed once with `jax.device_put`, theirs as CUDA tensors), each call
waited for (`block_until_ready`, `torch.cuda.synchronize`): BERT-base at
batch x length 128 x 288 and 32 x 512, and MiniLM-L6 when its weights are at
hand (bundle/minilm, else the embedded package); BERT-base again compiled
as a training step's forward is, with XLA's default products
(`target.compiler_options`).
"""

import gc
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
         'ours_gflop_per_s': flops.measured_matmul(size=size, calls=calls) / 1e9}
  theirs = peak.torch_matmul('float32', size, calls)
  if not theirs:
    return {**row, 'skipped_theirs': 'torch not installed'}
  return {**row, 'theirs_gflop_per_s': theirs['PyTorch'] / 1e9,
          'time_ratio': theirs['PyTorch'] / 1e9 / row['ours_gflop_per_s']}


# The accelerator mode: (batch, length) pairs, and --quick's.
ACCELERATOR_SHAPES = ((128, 288), (32, 512))
QUICK_SHAPES = ((4, 32),)
# --quick's stand-in for BERT-base: the same code path, a tiny width.
QUICK_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=256)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def minilm_dir() -> str | None:
  """MiniLM-L6's weights: the bundle's (a GPU machine's), else the embedded
  package's; None when neither is here."""
  bundled = os.path.join(REPOSITORY, 'bundle', 'minilm')
  if os.path.exists(os.path.join(bundled, 'model.safetensors')):
    return bundled
  from realm_jax import default_files, errors  # pylint: disable=g-import-not-at-top
  try:
    return default_files.minilm_dir()
  except errors.NotFound:
    return None


def versions() -> str:
  """'jax X (platform)' and, when installed, 'torch Y': the compilers."""
  import jax  # pylint: disable=g-import-not-at-top
  text = f'jax {jax.__version__} ({jax.devices()[0].platform})'
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return text
  return f'{text}, torch {torch.__version__}'


def _random_bert_dir(directory: str, **config) -> str:
  """A randomly initialized transformers BertModel (BERT-base unless
  `config` says otherwise), saved with safetensors."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.utils.logging.disable_progress_bar()
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(**config)).save_pretrained(
      directory, safe_serialization=True)
  return directory


def _ours_on_device(directory: str, dtype: str, param_dtype: str,
                    forward_only: bool = True):
  """(config, forward(ids, mask) -> device array): our BERT, its parameters
  placed on device 0 once, compiled as a forward-only program
  (`target.forward_only_jit`), or with `forward_only` False as a training
  step's forward is (XLA's default products, the bias in float32)."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models import pretrained, target  # pylint: disable=g-import-not-at-top
  from realm_jax.models.bert import Bert  # pylint: disable=g-import-not-at-top
  config = pretrained.config_from_hf(os.path.join(directory, 'config.json'),
                                     dtype=dtype, param_dtype=param_dtype)
  params = jax.device_put(pretrained.load_bert_params(directory, config),
                          jax.devices()[0])
  model = Bert(config)
  forward = lambda p, ids, mask: model.apply(
      {'params': p}, ids, mask).sequence_output
  apply = (target.forward_only_jit(forward, target.platform_of(
      jax.devices()[:1])) if forward_only else jax.jit(forward))
  return config, lambda ids, mask: apply(params, ids, mask)


def _theirs_on_device(directory: str, dtype: str):
  """forward(ids, mask) -> tensor: transformers' BertModel in `dtype` with
  PyTorch's fused attention (sdpa), on the GPU when there is one."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.utils.logging.disable_progress_bar()
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  model = transformers.BertModel.from_pretrained(
      directory, dtype=getattr(torch, dtype), attn_implementation='sdpa'
  ).to(device).eval()

  def forward(ids, mask):
    with torch.inference_mode():
      return model(input_ids=ids, attention_mask=mask).last_hidden_state
  return forward, device


def _synchronized(device: str):
  import torch  # pylint: disable=g-import-not-at-top
  return torch.cuda.synchronize if device == 'cuda' else (lambda: None)


def compare_on_device(name: str, directory: str, shapes, calls: int,
                      dtype: str = 'bfloat16', param_dtype: str = 'bfloat16',
                      time_left=lambda: float('inf'),
                      forward_only: bool = True) -> list[dict]:
  """One row per (batch, length): ours against transformers' on the same
  weights and inputs, both on the device, alternating call by call; median
  ms per call. A shape starts only while `time_left()` exceeds what the
  previous shape took. `forward_only` False: ours compiled as a training
  step's forward is (`_ours_on_device`)."""
  import jax  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  config, ours = _ours_on_device(directory, dtype, param_dtype,
                                 forward_only)
  try:
    theirs, torch_device = _theirs_on_device(directory, dtype)
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    theirs, skipped = None, f'{error.name} not installed'
  device = jax.devices()[0]
  base = {'benchmark': 'encoder', 'device': device.device_kind,
          'compiler': versions(), 'model': name, 'dtype': dtype,
          'param_dtype': param_dtype, 'forward_only': forward_only}
  rows, needed = [], time.perf_counter() - started
  rng = np.random.default_rng(0)
  for batch, length in shapes:
    row = {**base, 'batch': batch, 'length': length}
    if time_left() < needed:
      rows.append({**row, 'skipped': f'time budget: {time_left():.0f} s '
                                     f'left, the last shape took {needed:.0f}'})
      print(rows[-1], flush=True)
      continue
    started = time.perf_counter()
    ids = rng.integers(1000, config.vocab_size, (batch, length), np.int32)
    mask = np.ones_like(ids)
    our_ids, our_mask = jax.device_put((ids, mask), device)
    start = time.perf_counter()
    out = np.asarray(ours(our_ids, our_mask), np.float32)  # Compiles.
    row['ours_first_call_s'] = time.perf_counter() - start
    forward_flops = batch * flops.encoder_forward(config, length)
    if theirs is None:
      times = [_seconds(lambda: ours(our_ids, our_mask).block_until_ready())
               for _ in range(calls)]
      rows.append({**row, 'ours_ms': statistics.median(times) * 1e3,
                   'skipped_theirs': skipped})
      print(rows[-1], flush=True)
      needed = time.perf_counter() - started
      continue
    their_ids = torch.from_numpy(ids.astype(np.int64)).to(torch_device)
    their_mask = torch.from_numpy(mask.astype(np.int64)).to(torch_device)
    sync = _synchronized(torch_device)
    their_out = theirs(their_ids, their_mask).float().cpu().numpy()
    diff = float(np.max(np.abs(out - their_out)))
    ours_call = lambda: ours(our_ids, our_mask).block_until_ready()

    def theirs_call():
      theirs(their_ids, their_mask)
      sync()
    for _ in range(2):  # Warm-up: autotuning, caches, clocks.
      ours_call()
      theirs_call()
    times = {'ours': [], 'theirs': []}
    sync()
    for _ in range(calls):
      times['ours'].append(_seconds(ours_call))
      times['theirs'].append(_seconds(theirs_call))
    ours_s, theirs_s = (statistics.median(times[k]) for k in times)
    rows.append({
        **row, 'ours_ms': ours_s * 1e3, 'theirs_ms': theirs_s * 1e3,
        'time_ratio': ours_s / theirs_s,
        'ours_tflop_per_s': forward_flops / ours_s / 1e12,
        'theirs_tflop_per_s': forward_flops / theirs_s / 1e12,
        'max_abs_diff': diff,
        'mean_abs_output': float(np.mean(np.abs(their_out)))})
    print(rows[-1], flush=True)
    needed = time.perf_counter() - started
  return rows


def accelerator(options) -> list[dict]:
  """Ours against transformers' PyTorch BERT on one device, in bfloat16:
  BERT-base (random weights) at 128 x 288 and 32 x 512, MiniLM-L6 likewise
  when its weights are here, BERT-base compiled as a training step's
  forward is (`forward_only` False: XLA's default products, the bias a pass
  of its own), and BERT-base at 128 x 288 with float32 parameters (the
  training policy's) last."""
  quick = options.quick
  time_left = getattr(options, 'time_left', lambda: float('inf'))
  shapes = QUICK_SHAPES if quick else ACCELERATOR_SHAPES
  calls = 3 if quick else 20
  minilm = minilm_dir()
  rows = []
  with tempfile.TemporaryDirectory() as directory:
    try:
      _random_bert_dir(directory, **(QUICK_BERT if quick else {}))
    except ImportError as error:
      rows.append({'benchmark': 'encoder', 'model': 'bert-base',
                   'skipped': f'{error.name} not installed'})
      directory = None
    name = 'bert-tiny (random)' if quick else 'bert-base (random)'
    if directory:
      rows += compare_on_device(name, directory, shapes, calls,
                                time_left=time_left)
    if minilm is None:
      rows.append({'benchmark': 'encoder', 'model': 'minilm-l6',
                   'skipped': 'no MiniLM weights (bundle/minilm, or the '
                              'embedded package)'})
    else:
      rows += compare_on_device('minilm-l6', minilm, shapes, calls,
                                time_left=time_left)
    if directory:
      rows += compare_on_device(name, directory, shapes, calls,
                                time_left=time_left, forward_only=False)
    if directory and not quick:
      rows += compare_on_device(name, directory, shapes[:1], calls,
                                param_dtype='float32', time_left=time_left)
  _release_torch_memory()
  return rows


def _release_torch_memory():
  """PyTorch's cached GPU memory back, for the JAX rows after these."""
  gc.collect()
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  if torch.cuda.is_available():
    torch.cuda.empty_cache()


def run(options) -> list[dict]:
  quick = options.quick
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  threads = os.cpu_count()
  if quick:
    return _compare('minilm-l6', default_files.minilm_dir(), (128,), batch=8,
                    calls=3, threads=threads)
  rows = [_matmul_row(threads)]
  rows += _compare('minilm-l6', default_files.minilm_dir(), LENGTHS, batch=32,
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
