"""The shared shape check: it names the argument, the letter and both sizes, on one line."""

from __future__ import annotations

import pytest
import torch

from trainer.algo.losses._shapes import expect_shape


def test_records_sizes_and_accepts_agreeing_shapes() -> None:
    sizes: dict[str, int] = {}
    expect_shape("fn", "x", torch.zeros(2, 3, 4), "B K N", sizes)
    expect_shape("fn", "y", torch.zeros(2, 4), "B N", sizes)
    assert sizes == {"B": 2, "K": 3, "N": 4}


def test_wrong_rank_names_the_expected_letters() -> None:
    with pytest.raises(ValueError, match=r"^fn: x must be \[B, K, N\], got shape \(2, 3\)$"):
        expect_shape("fn", "x", torch.zeros(2, 3), "B K N", {})


def test_disagreeing_size_names_both_sizes() -> None:
    sizes = {"B": 2}
    with pytest.raises(ValueError, match=r"^fn: y has B=5 but B=2 elsewhere \(shape \(5, 4\), expected \[B, N\]\)$"):
        expect_shape("fn", "y", torch.zeros(5, 4), "B N", sizes)
