"""Running one training: the loop, checkpoints, progress lines, Prometheus metrics and step timing."""
