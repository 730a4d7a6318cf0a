"""realm-jax benchmarks: `python -m benchmarks.run [--quick] [--only NAME]`."""
