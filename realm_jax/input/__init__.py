"""The input layer: where every run's examples come from (`source.Source`),
the one gin choice of it (`configured`), the seqio tasks and the arrays
exported from them."""
