"""Training: partitioning, optimizer (and, next, the train loop)."""
