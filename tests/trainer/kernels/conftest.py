"""Triton kernels run on the CPU through Triton's interpreter where there is no GPU (CI)."""

import os

import torch

if not torch.cuda.is_available():
    # Read when a kernel is decorated, so before any test module imports trainer.kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")
