"""The presets that ship, one file each (`realm-jax demo --preset=<name>`);
`_wiki` holds the stages of the Wikipedia-leads presets."""
