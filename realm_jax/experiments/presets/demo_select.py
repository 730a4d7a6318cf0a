"""`demo --preset=demo_select`: the demo, then its ICT and REALM
retrievers' recall on the questions levers are chosen on (NQ's dev topics,
WebQuestions' train questions): the figures each lever's own are set
beside (docs/levers.md). A work_dir that `make demo` filled runs the
selection stages alone."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki, demo

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes=demo.PRESET.sizes,
    stages=(*demo.PRESET.stages, _wiki.select('ict'), _wiki.select('realm')),
    comparisons=(*demo.PRESET.comparisons, ('select', ('realm', 'ict'))))
