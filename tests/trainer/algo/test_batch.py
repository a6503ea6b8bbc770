"""The static Batch: shapes and dtypes of docs/architecture.md, in-place copies."""

from __future__ import annotations

import pytest
import torch

from trainer.algo.batch import Batch


def test_empty_has_the_documented_layout() -> None:
    batch = Batch.empty(4, obs_dim=6, branches=3, window=2, device="cpu")
    assert batch.size == 4
    assert batch.window.shape == (4, 2, 6) and batch.action.shape == (4, 3)
    assert batch.action.dtype == batch.index.dtype == torch.int64
    assert batch.obs.dtype == batch.done.dtype == batch.weight.dtype == torch.float32
    assert (batch.weight == 1).all()


def test_copy_writes_in_place() -> None:
    target = Batch.empty(2, 3, 1, 2, "cpu")
    source = Batch.empty(2, 3, 1, 2, "cpu")
    source.obs.fill_(5.0)
    source.index.copy_(torch.tensor([7, 8]))
    pointer = target.obs.data_ptr()
    target.copy_(source)
    assert target.obs.data_ptr() == pointer and (target.obs == 5.0).all()
    assert target.index.tolist() == [7, 8]
    assert target.to("cpu").index.tolist() == [7, 8]


def test_empty_rejects_zero_sizes() -> None:
    with pytest.raises(ValueError, match="positive sizes"):
        Batch.empty(0, 6, 3, 2, "cpu")
