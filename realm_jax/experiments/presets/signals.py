"""`demo --preset=signals`: the demo's REALM beside the same run with the
retriever trained by perplexity distillation (Atlas;
`run_kinds.retriever_signal`), both from the one ICT retriever and warm
reader, for the same steps, against the one trained baseline; each scored
as the demo scores REALM. EMDR2's signal has no run of its own: with this
reader, which reads each block apart, its pre-training gradient is the
marginal's (`losses._mlm_successor_terms`). A work_dir that `make demo`
filled is reused: its corpus, warm starts, REALM and baseline stay."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki, demo

SUCCESSORS = ('pdist',)
RUNS = {'realm': {},
        **{name: {'retriever_signal.name': name} for name in SUCCESSORS},
        'baseline': {'Pretrain.num_candidates': 1}}
TRAINED = ('realm', *SUCCESSORS)

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes=demo.PRESET.sizes,
    stages=(
        *_wiki.warm_starts(demo.BLOCK_LENGTH, demo.ICT_STEPS,
                           demo.READER_STEPS, demo.BATCH),
        *_wiki.pretraining(RUNS, demo.PRETRAIN_STEPS, demo.PRETRAIN_BATCH,
                           demo.REFRESH_INTERVAL),
        *(_wiki.recall(f'recall_{name}', name) for name in TRAINED),
        *(_wiki.select(name) for name in ('ict', *TRAINED))),
    comparisons=(
        ('masked_lm', *((name, 'baseline') for name in TRAINED),
         *((name, 'realm') for name in SUCCESSORS)),
        *((kind, *((name, 'ict') for name in TRAINED),
           *((name, 'realm') for name in SUCCESSORS))
          for kind in ('recall', 'select'))))
