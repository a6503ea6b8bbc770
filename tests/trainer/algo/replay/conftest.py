"""Factories for replay tests: small configs, a goal spec whose goals encode (episode, step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from contracts.config import TrainConfig, build_config
from trainer.execution.data.spec import EnvSpec, GoalSpec, Transitions

F = 4  # obs = [desired goal, episode id, episode step, stream]


def l1_goal_reward(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
    return -(achieved - desired).abs().sum(-1)


@pytest.fixture
def goal_spec() -> EnvSpec:
    """obs[0] is the desired goal; next_obs[3] the achieved one (values are ours, not an env's)."""
    goal = GoalSpec(desired=slice(0, 1), achieved=slice(3, 4), goal_reward=l1_goal_reward)
    return EnvSpec(obs_dim=F, branches=2, actions=3, goal=goal)


@pytest.fixture
def make_config() -> Callable[..., TrainConfig]:
    def make(capacity: int = 64, num_envs: int = 1, window: int = 4, **replay: Any) -> TrainConfig:
        return build_config(
            {
                "replay": {"capacity": capacity, **replay},
                "data": {"num_envs": num_envs},
                "model": {"attn_window": window, "attn_heads": 1, "attn_dim": 8},
                "run": {"batch_size": min(16, capacity), "steps": 100},
            }
        )

    return make


def episode_rows(episode: int, steps: range, stream: int = 0, length: int | None = None) -> Transitions:
    """Rows of one episode: obs = [goal 0.5, episode, step, stream]; achieved goal 100*episode + step."""
    n = len(steps)
    step = torch.tensor(list(steps), dtype=torch.float32)
    column = [torch.full((n,), 0.5), torch.full((n,), float(episode)), step, torch.full((n,), float(stream))]
    obs = torch.stack(column, 1)
    achieved = (100.0 * episode + step)[:, None]
    last = torch.zeros(n, dtype=torch.bool)
    if length is not None:
        last = step == length - 1
    return Transitions(
        obs=obs,
        action=torch.stack([step.long() % 3, (step.long() + 1) % 3], 1),
        reward=torch.full((n,), 7.0),
        next_obs=obs + 1.0,
        done=last.float(),
        last=last,
        episode_step=step.long(),
        achieved_goal=achieved,
        base_reward=torch.full((n,), 1.0),
    )


def stack_rows(parts: list[Transitions]) -> Transitions:
    """Row-wise concatenation (one row per env per `add`, or a block for `extend`)."""

    def cat(name: str) -> Any:
        values = [getattr(p, name) for p in parts]
        return None if values[0] is None else torch.cat(values)

    names = ("obs", "action", "reward", "next_obs", "done", "last", "episode_step", "achieved_goal", "base_reward")
    return Transitions(**{name: cat(name) for name in names})
