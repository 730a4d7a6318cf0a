"""Everything a train step reads and writes, as one sharded pytree."""

from typing import Any

import jax
from flax import struct


@struct.dataclass
class TrainState:
  """step: updates applied so far; rng: the run's base key (dropout keys fold
  the step in, so a resumed run draws the same ones)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
