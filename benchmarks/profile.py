"""Where a training step's device time goes: JAX's profiler over a few of
the trainer's steps (built as benchmarks/train_step.py builds them), its
trace summed by kernel and by XLA op, each with its share of the step, and
how much of the step's wall time the device was busy at all.

  python -m benchmarks.profile --model=minilm-l6 --batch=64 \\
      --setup=gin/setups/gpu_demo.gin --output_dir=/tmp/profile
  python -m benchmarks.profile --forward --model=bert-base --batch=128 \\
      --length=288 --output_dir=/tmp/profile

`--forward`: the encoder benchmark's call instead of a training step (one
BERT's forward on random weights and wordpieces, parameters in the compute
dtype, no padding), which is also the index builder's embedding work.

The table groups names by kind (matmul, attention, normalization and
softmax, other fusions, copies); the JSON (profile.json) keeps every line
of the trace's devices with its top names. On a CPU the trace has no device
lines: the host's XLA threads stand in.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile
import time

import jax

from benchmarks import train_step

# Kinds of kernel and XLA op, by name, first match wins.
KINDS = (
    ('attention', r'sdpa|fmha|flash|attention|cudnn'),
    ('matmul', r'gemm|xmma|cutlass|nvjet|cublas|dot|matmul|convolution'),
    ('normalization and softmax', r'reduce|norm|softmax'),
    ('copies', r'copy|memcpy|memset|transpose|dynamic-update-slice'),
    ('other fusions', r'fusion'),
)
TOP = 25


def kind_of(name: str) -> str:
  for kind, pattern in KINDS:
    if re.search(pattern, name, re.IGNORECASE):
      return kind
  return 'other'


def _busy(intervals) -> float:
  """Microseconds covered by the union of (start, duration) intervals."""
  busy, end = 0.0, float('-inf')
  for start, duration in sorted(intervals):
    stop = start + duration
    if stop > end:
      busy += stop - max(start, end)
      end = stop
  return busy


def summarize(trace_file: str, steps: int) -> dict:
  """Per line (a device stream, XLA's op line, or on a CPU the host's XLA
  threads): milliseconds a step busy, and its names and kinds summed."""
  with gzip.open(trace_file, 'rt') as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  processes, threads = {}, {}
  for e in events:
    if e.get('ph') == 'M' and e.get('name') == 'process_name':
      processes[e['pid']] = e['args']['name']
    if e.get('ph') == 'M' and e.get('name') == 'thread_name':
      threads[e['pid'], e['tid']] = e['args']['name']
  devices = {pid for pid, name in processes.items()
             if name.startswith('/device:')}
  keep = ((lambda pid, tid: pid in devices) if devices else
          (lambda pid, tid: 'XLA' in threads.get((pid, tid), '')))
  lines = collections.defaultdict(list)
  for e in events:
    if e.get('ph') == 'X' and keep(e['pid'], e.get('tid')):
      line = (f'{processes.get(e["pid"], e["pid"])} '
              f'{threads.get((e["pid"], e.get("tid")), e.get("tid"))}')
      lines[line].append(e)
  summary = {}
  for line, found in lines.items():
    names, kinds = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for e in found:
      # Numbered copies of one fusion (fusion.12, fusion.13) are one name.
      name = re.sub(r'[._]\d+$', '', e['name'])
      names[name] += e['dur']
      counts[name] += 1
      kinds[kind_of(name)] += e['dur']
    busy = _busy((e['ts'], e['dur']) for e in found)
    summary[line] = {
        'busy_ms_a_step': busy / 1e3 / steps,
        'kinds_ms_a_step': {k: v / 1e3 / steps for k, v in kinds.most_common()},
        'top': [{'name': n, 'ms_a_step': v / 1e3 / steps,
                 'calls_a_step': counts[n] / steps, 'kind': kind_of(n)}
                for n, v in names.most_common(TOP)]}
  return summary


def _traced(call, steps: int, trace_dir: str | None):
  """(wall seconds a call, the trace's file): two calls to compile and
  warm, then `steps` traced."""
  for _ in range(2):
    jax.block_until_ready(call())
  trace_dir = trace_dir or tempfile.mkdtemp(prefix='profile-')
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    for _ in range(steps):
      out = call()
    jax.block_until_ready(out)
    wall = (time.perf_counter() - start) / steps
  trace_file = max(glob.glob(os.path.join(
      trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True),
                   key=os.path.getmtime)
  return wall, trace_file


def profile(run: str, model: str, batch: int, steps: int, dtype: str,
            bindings=(), setups=(), trace_dir: str | None = None) -> dict:
  """Two steps to compile and warm, then `steps` steps traced; the
  summary, the wall time a step and the trace's file."""
  trainer, state, inputs, step_flops = train_step.build(
      run, model, batch, dtype, bindings, setups)
  inputs = jax.device_put(inputs)
  held = {'state': state}

  def call():
    held['state'], metrics = trainer.step(held['state'], inputs)
    return metrics
  wall, trace_file = _traced(call, steps, trace_dir)
  return {'run': run, 'model': model, 'batch': batch, 'dtype': dtype,
          'device': jax.devices()[0].device_kind, 'steps': steps,
          'bindings': list(bindings), 'setups': list(setups),
          'step_ms': wall * 1e3, 'model_tflop_per_step': step_flops / 1e12,
          'lines': summarize(trace_file, steps), 'trace': trace_file}


def profile_forward(model: str, batch: int, length: int, steps: int,
                    dtype: str, bindings=(), trace_dir: str | None = None
                    ) -> dict:
  """The summary of `steps` forward calls of `model`'s BERT at batch x
  length, as benchmarks/encoder.py times it against PyTorch's."""
  import gin  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_jax.models import flops  # pylint: disable=g-import-not-at-top
  from realm_jax.models.bert import Bert, BertConfig  # pylint: disable=g-import-not-at-top
  gin.parse_config_files_and_bindings(
      [os.path.join(train_step.GIN_DIR, 'models',
                    f'{train_step.MODELS[model]}.gin')],
      [f"BertConfig.dtype = '{dtype}'", f"BertConfig.param_dtype = '{dtype}'",
       *bindings])
  config = BertConfig()
  gin.clear_config()
  rng = np.random.default_rng(0)
  ids = jax.device_put(rng.integers(1000, config.vocab_size, (batch, length),
                                    np.int32))
  mask = jax.device_put(np.ones((batch, length), np.int32))
  model_ = Bert(config)
  params = jax.jit(model_.init)(jax.random.PRNGKey(0), ids, mask)['params']
  forward = jax.jit(lambda p, i, m: model_.apply({'params': p}, i, m)
                    .sequence_output)
  wall, trace_file = _traced(lambda: forward(params, ids, mask), steps,
                             trace_dir)
  return {'run': 'forward', 'model': model, 'batch': batch, 'length': length,
          'dtype': dtype, 'device': jax.devices()[0].device_kind,
          'steps': steps, 'bindings': list(bindings), 'setups': [],
          'step_ms': wall * 1e3,
          'model_tflop_per_step': batch * flops.encoder_forward(
              config, length) / 1e12,
          'lines': summarize(trace_file, steps), 'trace': trace_file}


def table(result: dict) -> str:
  """Each line's kinds and top names, in ms a step and % of the wall."""
  wall = result['step_ms']
  out = [f'{result["run"]} step, {result["model"]}, batch {result["batch"]}'
         f', {result["device"]}: {wall:.1f} ms a step']
  for line, found in result['lines'].items():
    out += [f'\n{line}: busy {found["busy_ms_a_step"]:.1f} ms a step '
            f'({100 * found["busy_ms_a_step"] / wall:.0f}% of the wall)',
            '| kind | ms a step | % of wall |', '|---|---|---|']
    out += [f'| {k} | {v:.2f} | {100 * v / wall:.1f} |'
            for k, v in found['kinds_ms_a_step'].items()]
    out += ['| name | kind | calls a step | ms a step |', '|---|---|---|---|']
    out += [f'| {t["name"][:90]} | {t["kind"]} | {t["calls_a_step"]:g} | '
            f'{t["ms_a_step"]:.2f} |' for t in found['top']]
  return '\n'.join(out)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--run', default='pretrain', choices=('pretrain', 'ict'))
  parser.add_argument('--model', default='minilm-l6',
                      choices=tuple(train_step.MODELS))
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--forward', action='store_true',
                      help='The BERT forward alone (the encoder benchmark).')
  parser.add_argument('--length', type=int, default=288,
                      help='--forward: the sequence length.')
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--dtype', default=None,
                      help='Default: bfloat16 on accelerators, float32 on '
                      'a CPU.')
  parser.add_argument('--setup', action='append', default=None,
                      help='Gin files after the run and the model (default: '
                      "the platform's setup, benchmarks/train_step.SETUPS).")
  parser.add_argument('--binding', action='append', default=[])
  parser.add_argument('--output_dir', required=True,
                      help='profile.json, profile.md and the trace.')
  args = parser.parse_args(argv)
  platform = jax.devices()[0].platform
  setups = args.setup or [train_step.setup_file(platform)]
  dtype = args.dtype or ('float32' if platform == 'cpu' else 'bfloat16')
  os.makedirs(args.output_dir, exist_ok=True)
  if args.forward:
    result = profile_forward(args.model, args.batch, args.length, args.steps,
                             dtype, args.binding)
  else:
    result = profile(args.run, args.model, args.batch, args.steps, dtype,
                     args.binding, setups)
  trace = os.path.join(args.output_dir, 'perfetto_trace.json.gz')
  shutil.copy(result['trace'], trace)
  result['trace'] = trace
  with open(os.path.join(args.output_dir, 'profile.json'), 'w') as f:
    json.dump(result, f, indent=1)
  report = table(result)
  with open(os.path.join(args.output_dir, 'profile.md'), 'w') as f:
    f.write(report + '\n')
  print(report)


if __name__ == '__main__':
  main()
