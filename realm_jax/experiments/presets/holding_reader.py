"""`demo --preset=holding_reader`: `sibling_reader` with a warm start in
which every query reads a block that holds its masked span (another block
of its article where one does, else its own: `Pretrain.source_block =
'holding'`), so that copying pays in every example; then REALM and the
trained baseline from that reader, scored as the demo scores them. A lever
(docs/levers.md). A work_dir that `make demo` filled is reused for the
corpus and ICT."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import (_wiki, demo, demo_select,
                                           sibling_reader)

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes=sibling_reader.SIZES,
    stages=(*sibling_reader.STARTS, sibling_reader.reader('holding'),
            *_wiki.pretraining(demo.RUNS, demo.PRETRAIN_STEPS,
                               demo.PRETRAIN_BATCH, demo.REFRESH_INTERVAL),
            _wiki.recall('recall_realm', 'realm'),
            _wiki.select('ict'), _wiki.select('realm')),
    comparisons=demo_select.PRESET.comparisons)
