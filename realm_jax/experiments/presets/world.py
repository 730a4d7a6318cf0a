"""`demo --preset=world`: REALM's four claims in a controlled knowledge world
of 1,000 people, where each fact is in one document (docs/results/world.md):
the retriever learns from the masked-LM loss alone, REALM beats its
trained baseline, a stale index costs, and an edited document is followed
without a training step."""

from realm_jax.data import world
from realm_jax.experiments.presets import _world

WORLD = world.WorldSpec(people=1000, first_names=40, last_names=40)
PRESET = _world.preset(WORLD, _world.Sizes(
    ict_steps=300, reader_steps=500, pretrain_steps=200, refresh_interval=5,
    warmup_steps=100))
