"""EnvSpec / GoalSpec validation and the goal columns helper."""

from __future__ import annotations

import pytest
import torch

from trainer.execution.data.spec import EnvSpec, GoalSpec, goal_columns


def l1(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
    return -(achieved - desired).abs().sum(-1)


def test_goal_columns_split_reward_into_base_and_goal_terms() -> None:
    spec = EnvSpec(obs_dim=4, branches=1, actions=2, goal=GoalSpec(slice(2, 4), slice(0, 2), l1))
    obs = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    next_obs = torch.tensor([[1.0, 3.0, 1.0, 1.0]])
    achieved, base = goal_columns(spec, obs, next_obs, torch.tensor([5.0]))
    assert achieved.tolist() == [[1.0, 3.0]]
    assert base.tolist() == [5.0 + 2.0]  # reward - goal_reward = 5 - (-2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EnvSpec(0, 1, 2), "obs_dim > 0"),
        (lambda: EnvSpec(4, 1, 1), "actions > 1"),
        (lambda: GoalSpec(slice(0, 2), slice(2, 3), l1), "equal size"),
        (lambda: EnvSpec(3, 1, 2, GoalSpec(slice(2, 4), slice(0, 2), l1)), "exceed obs_dim 3"),
        (lambda: goal_columns(EnvSpec(2, 1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1)), "goal"),
    ],
)
def test_bad_specs_raise(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]
