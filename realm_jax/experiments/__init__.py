"""The presets: one file each (`presets/`, data: stages, runs, bindings,
comparisons), the one runner that executes any of them (`runner`), and the
stage kinds and reports of their two families, the Wikipedia leads
(`demo`, `demo_report`) and the controlled world (`world_demo`,
`world_report`)."""
