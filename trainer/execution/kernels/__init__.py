"""Triton kernels, each replacing one named function of the maths (`trainer.algo.model`, `trainer.algo.losses`)."""

import os


def interpreted() -> bool:
    """Whether Triton runs its interpreter (TRITON_INTERPRET=1: the CPU tests), which cannot time kernels and
    mishandles some bf16 operations."""
    return os.environ.get("TRITON_INTERPRET") == "1"
