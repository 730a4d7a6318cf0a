"""`demo --preset=sibling_reader`: the demo with a reader warm start that
reads, for every query, another block of the query's own article (the
blocks REALM may retrieve, as it excludes the query's own block alone),
masked as REALM masks (salient spans) and at REALM's reader length, for
three times the demo's steps; REALM, its successors' signals and the
trained baseline then start from that reader. A lever (docs/levers.md):
the reader learns to copy a span where its article's other text holds it.
A work_dir that `make demo` filled is reused for the corpus and ICT."""

import dataclasses

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki, demo, signals

READER_STEPS = 3 * demo.READER_STEPS


def reader(source_block: str, steps: int = READER_STEPS):
  """The warm start of `steps` in which every query reads the
  `source_block` (`Pretrain.source_block`) of its article."""
  stage = _wiki.reader(steps, demo.BATCH)
  bindings = {**stage.args['bindings'], 'Pretrain.source_block_rate': 1.0,
              'Pretrain.source_block': source_block, 'Pretrain.masking':
                  'salient', 'build_realm.reader_length': 112}
  return dataclasses.replace(stage, args={**stage.args,
                                          'bindings': bindings})


# The demo's corpus, machine, ICT retriever and its recall.
STARTS = _wiki.warm_starts(demo.BLOCK_LENGTH, demo.ICT_STEPS,
                           demo.READER_STEPS, demo.BATCH)[:4]
SIZES = {**demo.PRESET.sizes, 'reader_steps': READER_STEPS}
PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes=SIZES,
    stages=(*STARTS, reader('sibling'),
            *_wiki.pretraining(signals.RUNS, demo.PRETRAIN_STEPS,
                               demo.PRETRAIN_BATCH, demo.REFRESH_INTERVAL),
            *(_wiki.recall(f'recall_{name}', name)
              for name in signals.TRAINED),
            *(_wiki.select(name) for name in ('ict', *signals.TRAINED))),
    comparisons=signals.PRESET.comparisons)
