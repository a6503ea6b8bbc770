"""Triton kernels, each replacing one named function of the maths (`trainer.algo.model`, `trainer.algo.losses`)."""
