"""`demo --preset=end_to_end`: the demo's stages (a work_dir `make demo`
filled is reused), then NQ fine-tuning from REALM twice: with the document
tower frozen (the paper's) and trained, the index builder beside the
trainer (EMDR2, Atlas)."""

from realm_jax.experiments.preset import Dir, Preset
from realm_jax.experiments.presets import _wiki, demo

FINETUNE_STEPS = 200
FROM_REALM = {'Finetune.pretrain_model_dir': Dir('realm')}

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=demo.PRESET.run_gin,
    sizes={**demo.PRESET.sizes, 'finetune_steps': FINETUNE_STEPS,
           'end_to_end': True},
    stages=(
        *demo.PRESET.stages,
        _wiki.finetune('realm', FINETUNE_STEPS, FROM_REALM),
        _wiki.qa('realm', ('nq_open',)),
        _wiki.finetune('realm_end_to_end', FINETUNE_STEPS, FROM_REALM,
                       refresh_interval=demo.REFRESH_INTERVAL),
        _wiki.qa('realm_end_to_end', ('nq_open',))),
    comparisons=(*demo.PRESET.comparisons, ('end_to_end',)))
