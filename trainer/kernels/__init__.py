"""Triton kernels, each replacing one named function of the maths (`trainer.model`, `trainer.losses`)."""
