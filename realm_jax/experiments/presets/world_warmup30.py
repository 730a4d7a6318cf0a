"""`demo --preset=world_warmup30`: the world with the top 7 and REALM's
warmup over 30 steps (100 by default), a lever the default was measured
against."""

from realm_jax.experiments.presets import _world, world

PRESET = _world.preset(world.WORLD, _world.Sizes(
    ict_steps=300, reader_steps=500, pretrain_steps=200, refresh_interval=5))
