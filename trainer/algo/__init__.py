"""The maths: the network, its losses, one update step over an explicit state, budgets and replay.

Pure functions of tensors; nothing here decides how the step runs (that is `trainer.execution`).
"""
