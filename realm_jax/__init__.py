"""realm-jax: REALM (Guu et al. 2020) retrieval-augmented pre-training in JAX."""

__version__ = '0.1.0'
