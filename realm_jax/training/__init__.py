"""Training: the train loop, the run kinds, checkpoints and partitioning."""
