"""`demo --preset=world_top3`: the world as it was first run, a lever the
default was measured against: the null document and the top 3 (8 in all
by default), REALM's warmup over 30 steps (100 by default)."""

from realm_jax.experiments.presets import _world, world

PRESET = _world.preset(world.WORLD, _world.Sizes(
    ict_steps=300, reader_steps=500, pretrain_steps=200, refresh_interval=5,
    candidates=4))
