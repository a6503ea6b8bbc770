"""The attention auxiliary's next-state loss."""

from __future__ import annotations

import pytest
import torch

from trainer.algo.losses.aux import next_state_loss


def test_next_state_loss_is_the_per_sample_mse(gen: torch.Generator) -> None:
    prediction = torch.randn(5, 7, generator=gen)
    next_obs = torch.randn(5, 7, generator=gen)
    loss = next_state_loss(prediction, next_obs)
    assert loss.shape == (5,)
    for b in range(5):
        expected = sum((float(prediction[b, f]) - float(next_obs[b, f])) ** 2 for f in range(7)) / 7
        assert abs(float(loss[b]) - expected) < 1e-5
    assert (next_state_loss(next_obs, next_obs) == 0).all()


def test_next_state_loss_rejects_mismatched_features() -> None:
    with pytest.raises(ValueError, match="next_obs has F=6 but F=7"):
        next_state_loss(torch.zeros(5, 7), torch.zeros(5, 6))
