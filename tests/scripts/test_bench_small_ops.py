"""scripts/bench_small_ops.py's split-K by hand: the pack's weight gradients it times are the batched product's."""

from __future__ import annotations

import pytest
import torch

from scripts.bench_small_ops import split_k_bmm


@pytest.mark.parametrize("chunks", [1, 4, 8])
def test_split_k_is_each_runs_weight_gradient(chunks: int) -> None:
    generator = torch.Generator().manual_seed(0)
    dy = torch.randn(3, 64, 5, generator=generator, dtype=torch.float64)  # [R, rows, outputs]
    x = torch.randn(3, 64, 7, generator=generator, dtype=torch.float64)  # [R, rows, inputs]
    got = split_k_bmm(dy, x, chunks)
    assert got.shape == (3, 5, 7)
    for run in range(3):
        torch.testing.assert_close(got[run], dy[run].T @ x[run], rtol=1e-12, atol=1e-12)


def test_split_k_refuses_rows_that_do_not_split() -> None:
    with pytest.raises(ValueError, match="48 rows do not split into 5 chunks"):
        split_k_bmm(torch.zeros(1, 48, 2), torch.zeros(1, 48, 3), 5)
