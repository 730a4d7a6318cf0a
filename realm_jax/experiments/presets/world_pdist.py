"""`demo --preset=world_pdist`: the world with the retriever trained by
perplexity distillation (Atlas): KL(softmax_z of the reader's mean
log p(y_j|z,x) / 0.01 || p(z|x)), the reader by its own likelihood as
REALM's (`run_kinds.retriever_signal`); REALM, its frozen control and the
trained baseline, without the ablations."""

import dataclasses

from realm_jax.experiments.presets import _world, world

PRESET = _world.preset(world.WORLD, dataclasses.replace(
    _world.Sizes(**world.PRESET.sizes), ablations=False), signal='pdist')
