"""`demo --preset=world_small`: tests/test_world.py's learning test: one
attribute, 300 people, REALM, its baseline, its start and its control (the
towers frozen)."""

from realm_jax.data import world
from realm_jax.experiments.presets import _world

PRESET = _world.preset(
    world.WorldSpec(people=300, no_document=20, attributes=('hometown',),
                    first_names=10, last_names=40, edited=0),
    _world.Sizes(ict_steps=60, reader_steps=80, pretrain_steps=60,
                 refresh_interval=5, candidates=4, ablations=False))
