"""Fixtures for the loss tests: a seeded generator so every random input is reproducible."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator with a fixed seed, fresh per test."""
    return torch.Generator().manual_seed(1234)
