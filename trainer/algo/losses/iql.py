"""Implicit Q-learning's expectile value loss (Kostrikov et al. 2021).

V(s) is regressed to an upper expectile of the target net's Q(s, a_data), so V estimates the value of
the best in-distribution actions without querying unseen ones. Per sample ([B]); capture-safe.
"""

from __future__ import annotations

from torch import Tensor

from trainer.algo.losses._shapes import expect_shape


def expectile_loss(value: Tensor, q_target: Tensor, expectile: float) -> Tensor:
    """Per-sample |expectile - 1{q_target - value < 0}| (q_target - value)^2; 0.5 gives half the MSE."""
    sizes: dict[str, int] = {}
    expect_shape("expectile_loss", "value", value, "B", sizes)
    expect_shape("expectile_loss", "q_target", q_target, "B", sizes)
    if not 0.0 < expectile < 1.0:
        raise ValueError(f"expectile_loss: expectile must lie in (0, 1), got {expectile}")
    # diff = Q - V; weight = |expectile - 1{diff < 0}|
    diff = q_target.detach() - value
    weight = (expectile - (diff.detach() < 0).to(diff.dtype)).abs()
    return weight * diff.square()  # [B]
