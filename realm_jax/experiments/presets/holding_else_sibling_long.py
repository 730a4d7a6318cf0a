"""`demo --preset=holding_else_sibling_long`: `holding_else_sibling_reader`
with REALM and the trained baseline pre-trained three times as long (the
300 steps of `reproduce`): whether, from a reader that copies where
copying pays, REALM's retriever moves given more steps. A lever
(docs/levers.md). A work_dir that `holding_else_sibling_reader` filled is
reused up to its reader."""

import dataclasses

from realm_jax.experiments.presets import _wiki, demo
from realm_jax.experiments.presets import holding_else_sibling_reader as base

PRETRAIN_STEPS = 3 * demo.PRETRAIN_STEPS
# corpus, machine, ict, recall_ict and the reader's warm start.
STARTS = base.PRESET.stages[:5]

PRESET = dataclasses.replace(
    base.PRESET,
    sizes={**base.PRESET.sizes, 'pretrain_steps': PRETRAIN_STEPS},
    stages=(*STARTS,
            *_wiki.pretraining(demo.RUNS, PRETRAIN_STEPS, demo.PRETRAIN_BATCH,
                               demo.REFRESH_INTERVAL),
            _wiki.recall('recall_realm', 'realm'),
            _wiki.select('ict'), _wiki.select('realm')))
