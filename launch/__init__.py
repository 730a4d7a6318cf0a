"""Launchers for the trainer and the index builder (docs/architecture.md,
"Two processes, one run directory"): `launch.pod` on two Cloud TPU slices,
`launch.local` as two processes on one machine.

Standard library only, and no import of realm_jax: they start the
`realm-jax` command line as processes, as a user would.
"""
