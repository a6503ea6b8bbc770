"""Settings for the whole suite."""

from __future__ import annotations

import os

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    # `make test` runs one pytest-xdist worker per core. torch's default of one intra-op thread per
    # core in every worker (and in every trainer process a test starts) puts several threads on each
    # core, which makes the small CPU models here several times slower. Set before torch is imported.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Inductor's CPU kernels without SIMD vectorisation: the tests compile the training step cold (no cache on
# a fresh CI machine) and run it a few times, and scalar C++ compiles in about 60% of the time (the torch
# .compile baseline test: 47 s against 79 s on 2 cores). The GPU's Triton code is not affected.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import torch  # after the settings above, which torch reads when it is imported

if not torch.cuda.is_available():
    # The trainer's Triton kernels (trainer/execution/kernels/) run on the CPU through Triton's interpreter. Read
    # when a kernel is decorated, so here, before any test module (of any folder) imports the trainer.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests first (a stable sort: the rest keep their order).

    Under pytest-xdist a few minute-long tests (learning, plan equivalence) then start at once, each
    on a worker of its own, while the quick ones fill in around them, instead of all ending the run.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
