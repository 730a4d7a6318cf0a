"""`demo --preset=holding_else_sibling_reader`: `holding_reader`, but
where no other block of the query's article holds its masked span the
warm start reads a random other block of it (`Pretrain.source_block =
'holding_else_sibling'`), never the query's own, and for twice as many
steps: copying pays where a block REALM may retrieve holds the span, and
only there. Then REALM and the trained baseline from that reader, scored
as the demo scores them. A lever (docs/levers.md). A work_dir that `make
demo` filled is reused for the corpus and ICT."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import (_wiki, demo, demo_select,
                                           sibling_reader)

READER_STEPS = 2 * sibling_reader.READER_STEPS

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes={**sibling_reader.SIZES, 'reader_steps': READER_STEPS},
    stages=(*sibling_reader.STARTS,
            sibling_reader.reader('holding_else_sibling', READER_STEPS),
            *_wiki.pretraining(demo.RUNS, demo.PRETRAIN_STEPS,
                               demo.PRETRAIN_BATCH, demo.REFRESH_INTERVAL),
            _wiki.recall('recall_realm', 'realm'),
            _wiki.select('ict'), _wiki.select('realm')),
    comparisons=demo_select.PRESET.comparisons)
