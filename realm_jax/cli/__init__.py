"""The `realm-jax` command line: one module a command, its parser beside its
handler; `realm_jax.main` dispatches.

Each module names its `COMMAND`, adds it with `add_parser(command, flags)`
(`command`: the subcommands' add_parser, the common --debug and --verbose
already its parents; `flags`: that parent parser, for a command with
subcommands of its own) and runs it with `run(args)`.
"""
