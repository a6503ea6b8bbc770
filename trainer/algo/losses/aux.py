"""The attention auxiliary's loss: predict the next state from the window of recent states.

Per sample ([B]); capture-safe.
"""

from __future__ import annotations

from torch import Tensor

from trainer.algo.losses._shapes import expect_shape


def next_state_loss(prediction: Tensor, next_obs: Tensor) -> Tensor:
    """Per-sample mean squared error over features between the predicted and the real next state."""
    sizes: dict[str, int] = {}
    expect_shape("next_state_loss", "prediction", prediction, "B F", sizes)
    expect_shape("next_state_loss", "next_obs", next_obs, "B F", sizes)
    # loss = mean_f (prediction - s')^2
    return (prediction - next_obs.detach()).square().mean(-1)  # [B]
