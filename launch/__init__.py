"""Launchers above the library (docs/architecture.md, "Two processes, one
run directory"): `launch.pod` starts the trainer and the index builder on two
Cloud TPU slices (standard library only: it starts the `realm-jax` command
line as a user would; `realm_jax.launch_local` does the same on one
machine), and `launch.bundle` packs what a GPU machine needs.
"""
