"""seqio task and mixture registrations for realm-jax (see tasks/README.md)."""
