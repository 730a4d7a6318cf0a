"""What a compiled program asks of a GPU, read without one: its kernel
launches and the bytes they read and write, by kind, from XLA:GPU's
compile for a card (`realm-jax aot`'s `gpu_target`; `make gpu-compiler`).

  python -m benchmarks.compiled_kernels --program=train --model=bert-base \\
      --batch=8 --output=/tmp/train.json
  python -m benchmarks.compiled_kernels --program=embed --model=bert-base \\
      --batch=256 --output=/tmp/embed.json

The counts follow the compiled HLO: every kernel of the entry computation
and of its loops' bodies, times the loops' trips (BERT's layers under
scan). A fusion's bytes are its operands' and its output's, except that a
`dynamic-slice` inside reads only its slice and a `dynamic-update-slice`
root writes only its update (in place). Not a time: nothing runs, nothing
is autotuned, and the bytes a cache serves are counted too. What it is
for: comparing two programs' traffic and launches (a lever's), which on a
memory-bound kernel are its time, before a GPU is at hand.
"""

import argparse
import collections
import json
import os
import re
import sys

# Bytes per element of the HLO types a step uses.
SIZES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2,
         'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8}
SHAPE = re.compile(r'\b(' + '|'.join(SIZES) + r')\[([0-9,]*)\]')
# name = shape op(operands): XLA writes /*index=5*/ before every fifth.
INSTRUCTION = re.compile(r'(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*?)\)')
# Instructions that launch nothing.
FREE = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
        'after-all', 'partition-id', 'replica-id'}


def nbytes(shapes: str) -> int:
  """The bytes of every array in an HLO shape (a tuple's: all of them)."""
  total = 0
  for kind, dims in SHAPE.findall(shapes):
    count = 1
    for d in filter(None, dims.split(',')):
      count *= int(d)
    total += count * SIZES[kind]
  return total


def computations(text: str) -> tuple[dict[str, list[str]], str]:
  """The HLO module's computations (name -> instruction lines) and the
  entry's name."""
  found, current, entry = {}, None, None
  for line in text.splitlines():
    if line and not line.startswith(' ') and line.rstrip().endswith('{'):
      words = line.split()
      name = (words[1] if words[0] == 'ENTRY' else words[0]).lstrip('%')
      current = found.setdefault(name, [])
      entry = name if words[0] == 'ENTRY' else entry
    elif current is not None and line.startswith('  '):
      current.append(line.strip())
  return found, entry


def _fusion_bytes(lines: list[str], operands: list[int],
                  output: int) -> tuple[int, int]:
  """(read, written) of a fusion: each operand whole, or, where the fusion
  reads it only through `slice`s and `dynamic-slice`s, those slices; its
  output whole, but a buffer that a `dynamic-update-slice` updates in
  place (the root, or one of a tuple root's) is neither read nor written
  beyond its update."""
  params, shapes, sliced = {}, {}, collections.Counter()
  whole = set()
  for line in lines:
    match = INSTRUCTION.match(line)
    if not match:
      continue
    label, shape, op, args = match.groups()
    shapes[label] = shape
    if op == 'parameter':
      params[label] = int(args)
  in_place, updates = set(), 0
  for line in lines:
    match = INSTRUCTION.match(line)
    if not match:
      continue
    _, shape, op, args = match.groups()
    names = re.findall(r'%([\w.\-]+)', args)
    if op in ('slice', 'dynamic-slice') and names[0] in params:
      sliced[params[names[0]]] += nbytes(shape)
      names = names[1:]
    whole.update(params[n] for n in names if n in params)
    if op == 'dynamic-update-slice' and names[0] in params:
      in_place.add(params[names[0]])
      updates += nbytes(shapes.get(names[1], ''))
      output -= nbytes(shape)
  read = sum(0 if i in in_place else size if i in whole else
             min(sliced.get(i, size), size)
             for i, size in enumerate(operands))
  return read, max(output, 0) + updates


def kernels(text: str) -> dict[str, dict]:
  """kind -> {'launches', 'bytes'} a call of the compiled program: a
  fusion's kind is its name less its number, a custom call's its target."""
  comps, entry = computations(text)
  shapes = {}
  for name, lines in comps.items():
    for line in lines:
      match = INSTRUCTION.match(line)
      if match:
        shapes[name, match.group(1)] = match.group(2)
  trips = collections.Counter({entry: 1})
  todo, counts = [entry], collections.defaultdict(
      lambda: {'launches': 0, 'bytes': 0})
  while todo:
    name = todo.pop()
    for line in comps.get(name, []):
      match = INSTRUCTION.match(line)
      if not match or match.group(3) in FREE:
        continue
      label, shape, op, args = match.groups()
      if op == 'while':
        body = re.search(r'body=%?([\w.\-]+)', line).group(1)
        n = re.search(r'"n":"(\d+)"', line)
        trips[body] += trips[name] * (int(n.group(1)) if n else 1)
        todo.append(body)
        continue
      if op == 'call':  # XLA:CPU's wrapping of a computation: its kernels.
        called = re.search(r'to_apply=%?([\w.\-]+)', line).group(1)
        trips[called] += trips[name]
        todo.append(called)
        continue
      operands = [nbytes(shapes.get((name, operand), ''))
                  for operand in re.findall(r'%([\w.\-]+)', args)]
      written, read = nbytes(shape), sum(operands)
      if op == 'fusion':
        kind = re.sub(r'[.\d]+$', '', label)
        fused = comps.get(re.search(r'calls=%?([\w.\-]+)', line).group(1), [])
        read, written = _fusion_bytes(fused, operands, written)
      elif op == 'dynamic-update-slice':  # In place: the update alone.
        kind, written = op, operands[1]
        read = written
      elif op == 'custom-call':
        kind = 'custom-call ' + re.search(
            r'custom_call_target="([^"]+)"', line).group(1)
      else:
        kind = op
      counts[kind]['launches'] += trips[name]
      counts[kind]['bytes'] += trips[name] * (read + written)
  return dict(counts)


def compile_program(program: str, model: str, batch: int, setups, bindings,
                    target_name: str, options=None):
  """(HLO text, memory analysis) of the train step or the embedding step,
  compiled for `target_name`'s first device; `options`: XLA's compiler
  options (name -> value), beside any the program sets itself."""
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  from realm_jax import aot  # pylint: disable=g-import-not-at-top
  from realm_jax.index.embed import DocumentEmbedder  # pylint: disable=g-import-not-at-top
  from realm_jax.models.realm import model_retriever  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning, run_loader  # pylint: disable=g-import-not-at-top
  from realm_jax.training.trainer import Trainer  # pylint: disable=g-import-not-at-top
  target = aot.gpu_target(target_name.removeprefix('gpu:'))
  gin_dir = train_step.GIN_DIR
  run_loader.configure(
      [f'{gin_dir}/runs/pretrain.gin',
       f'{gin_dir}/models/{train_step.MODELS[model]}.gin', *setups],
      ["Pretrain.bert_dir = ''", 'bert_adamw.warmup_steps = 1', *bindings])
  run = run_loader.configured_run().run
  trainer = Trainer(run.objective,
                    partitioning.make_mesh(devices=target.devices[:1]), 1000)
  if program == 'train':
    lowered = trainer.lower(run.objective.abstract_inputs(
        batch, run.block_length or train_step.BLOCK_LENGTH))
  else:
    embedder = DocumentEmbedder(model_retriever(), batch, target.devices[:1])
    lowered = embedder.lower(
        aot._unsharded(trainer.abstract_state.params['retriever']),  # pylint: disable=protected-access
        train_step.BLOCK_LENGTH)
  compiled = lowered.compile(options or None)
  return compiled.as_text(), compiled.memory_analysis()


def table(result: dict) -> str:
  lines = [f"{result['program']} step, {result['model']}, batch "
           f"{result['batch']}, compiled by XLA:GPU for {result['target']}: "
           f"{result['temp_gib']:.2f} GiB of temporaries, "
           f"{result['launches']:,} launches, {result['gib']:.1f} GiB read and "
           'written a call', '',
           '| kind | launches | GiB read + written |', '|---|---|---|']
  for kind, row in sorted(result['kinds'].items(),
                          key=lambda item: -item[1]['bytes'])[:15]:
    lines.append(f"| {kind} | {row['launches']:,} | "
                 f"{row['bytes'] / 2 ** 30:.2f} |")
  return '\n'.join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--program', choices=('train', 'embed'),
                      default='train')
  parser.add_argument('--model', default='bert-base',
                      choices=('tiny', 'minilm-l6', 'bert-base'))
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--target', default='gpu:h100')
  parser.add_argument('--setup', action='append', default=None,
                      help='Gin files after the run and the model (default: '
                      'gin/setups/gpu.gin).')
  parser.add_argument('--binding', action='append', default=[])
  parser.add_argument('--option', action='append', default=[],
                      help="An XLA compiler option, name=value (for example "
                      "xla_gpu_enable_dynamic_slice_fusion=True).")
  parser.add_argument('--output', default=None, help='Also the JSON here.')
  args = parser.parse_args(argv)
  from realm_jax import extras, gpu_compiler  # pylint: disable=g-import-not-at-top
  if 'jax' in sys.modules:
    raise RuntimeError('JAX started before its CUDA plugin was on the path.')
  os.environ['JAX_PLATFORMS'] = 'cpu'  # This machine's; the GPU's compiler.
  try:
    gpu_compiler.use()
  except extras.MissingExtra as error:
    sys.exit(f'compiled_kernels: {error}')
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  text, memory = compile_program(
      args.program, args.model, args.batch,
      args.setup or [train_step.setup_file('gpu')], args.binding, args.target,
      dict(option.split('=', 1) for option in args.option))
  kinds = kernels(text)
  result = {'program': args.program, 'model': args.model,
            'batch': args.batch, 'target': args.target,
            'setups': args.setup, 'bindings': args.binding,
            'options': args.option,
            'temp_gib': memory.temp_size_in_bytes / 2 ** 30,
            'argument_gib': memory.argument_size_in_bytes / 2 ** 30,
            'launches': sum(k['launches'] for k in kinds.values()),
            'gib': sum(k['bytes'] for k in kinds.values()) / 2 ** 30,
            'kinds': kinds}
  print(table(result))
  if args.output:
    with open(args.output, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
