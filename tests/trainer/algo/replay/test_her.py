"""HER "future" relabelling on sampled batches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from contracts.config import TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.replay.her import HindsightRelabeler
from trainer.execution.data.spec import EnvSpec

from .conftest import episode_rows, l1_goal_reward, stack_rows


def filled_buffer(config: TrainConfig, spec: EnvSpec, seed: int = 0) -> ReplayBuffer:
    """Two finished episodes via `extend`, then two env streams still running via `add`."""
    buffer = ReplayBuffer(config, spec, "cpu", torch.Generator().manual_seed(seed))
    buffer.extend(stack_rows([episode_rows(1, range(6), length=6), episode_rows(2, range(3), length=3)]))
    for step in range(5):
        buffer.add(stack_rows([episode_rows(3, range(step, step + 1), 0), episode_rows(4, range(step, step + 1), 1)]))
    return buffer


def test_relabelled_goals_come_from_the_same_episode_at_or_after(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec
) -> None:
    buffer = filled_buffer(make_config(capacity=64, num_envs=2, her_ratio=1.0), goal_spec)
    batch = buffer.sample(512, 0)
    episode, step = batch.obs[:, 1], batch.obs[:, 2]
    goal = batch.obs[:, 0]
    goal_episode, goal_step = torch.div(goal, 100, rounding_mode="floor"), goal.remainder(100)
    assert torch.equal(goal_episode, episode)
    assert (goal_step >= step).all()
    length = torch.tensor([0, 6, 3, 5, 5], dtype=torch.float32)[episode.long()]
    assert (goal_step < length).all()
    assert (goal_step > step).any() and (goal_step == step).any()  # "future" covers both
    torch.testing.assert_close(batch.next_obs[:, 0], goal)
    achieved = (100 * episode + step)[:, None]
    torch.testing.assert_close(batch.reward, 1.0 + l1_goal_reward(achieved, goal[:, None]))


def test_unrelabelled_rows_are_unchanged_and_ratio_is_respected(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec
) -> None:
    buffer = filled_buffer(make_config(capacity=64, num_envs=2, her_ratio=0.3), goal_spec)
    batch = buffer.sample(2000, 0)
    kept = batch.obs[:, 0] == 0.5  # the original desired goal (achieved goals are >= 100)
    assert 0.6 < float(kept.float().mean()) < 0.8
    assert (batch.reward[kept] == 7.0).all()
    assert (batch.next_obs[kept, 0] == 1.5).all()
    assert (batch.reward[~kept] != 7.0).all()


def test_window_goal_is_relabelled_on_real_states_only(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec
) -> None:
    buffer = filled_buffer(make_config(capacity=64, num_envs=2, window=4, her_ratio=1.0), goal_spec)
    batch = buffer.sample(256, 0)
    real = batch.window[:, :, 1] > 0  # episode ids are >= 1 on real states
    assert torch.equal(batch.window[:, :, 0][real], batch.obs[:, 0, None].expand(-1, 4)[real])
    assert (batch.window[~real] == 0).all()
    torch.testing.assert_close(batch.window[:, -1], batch.obs)


def test_her_off_without_goal_or_when_disabled(make_config: Callable[..., TrainConfig], goal_spec: EnvSpec) -> None:
    plain = EnvSpec(obs_dim=4, branches=2, actions=3)
    assert ReplayBuffer(make_config(), plain, "cpu", torch.Generator()).her is None
    assert ReplayBuffer(make_config(her=False), goal_spec, "cpu", torch.Generator()).her is None
    assert ReplayBuffer(make_config(her_ratio=0.0), goal_spec, "cpu", torch.Generator()).her is None
    with pytest.raises(ValueError, match=r"her_ratio must be in \[0, 1\]"):
        HindsightRelabeler(goal_spec.goal, 1.5)  # type: ignore[arg-type]
