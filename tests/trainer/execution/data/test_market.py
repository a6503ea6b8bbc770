"""The synthetic market: API, determinism, goal reward, and room to learn."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from trainer.execution.data.market import (
    ENV_ID,
    GOAL,
    POSITIONS,
    MarketEnv,
    goal_reward,
    register_market,
    signal_policy,
)


def episode_returns(policy: str, episodes: int, seed: int) -> list[float]:
    env = MarketEnv(features=64, horizon=200)
    rng = np.random.default_rng(seed)
    returns = []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        total, over = 0.0, False
        while not over:
            action = signal_policy(obs[None])[0] if policy == "signal" else rng.integers(0, 5, 3)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            over = terminated or truncated
        returns.append(total)
    return returns


def test_spaces_shapes_and_truncation_at_horizon() -> None:
    env = MarketEnv(features=20, horizon=10)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (20,) and obs.dtype == np.float32
    assert env.action_space == gym.spaces.MultiDiscrete([5, 5, 5])
    flags = [env.step(np.array([4, 0, 2]))[2:4] for _ in range(10)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
    assert env.step(np.array([4, 0, 2]))[0][POSITIONS].tolist() == [1.0, -1.0, 0.0]


def test_same_seed_same_episode_other_seed_differs() -> None:
    def trace(seed: int) -> np.ndarray:
        env = MarketEnv(features=32, horizon=30)
        obs, _ = env.reset(seed=seed)
        rows = [obs]
        for t in range(30):
            obs, reward, *_ = env.step(np.array([t % 5, (t + 1) % 5, 2]))
            rows.append(np.append(obs, reward))
        return np.concatenate(rows)

    assert np.array_equal(trace(5), trace(5))
    assert not np.array_equal(trace(5), trace(6))


def test_goal_reward_of_env_and_torch_agree() -> None:
    env = MarketEnv()
    spec = env.goal_spec()
    assert (spec.desired, spec.achieved) == (GOAL, POSITIONS)
    obs, _ = env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(20):
        next_obs, _, _, _, info = env.step(rng.integers(0, 5, 3))
        achieved = torch.from_numpy(next_obs[POSITIONS]).double()
        desired = torch.from_numpy(obs[GOAL]).double()
        assert float(spec.goal_reward(achieved, desired)) == pytest.approx(info["goal_reward"])
        obs = next_obs
    batch = goal_reward(torch.zeros(4, 2, 3), torch.ones(4, 2, 3))
    assert batch.shape == (4, 2) and torch.allclose(batch, torch.full((4, 2), -3 * env.goal_coef))


def test_signal_policy_beats_random_by_a_wide_margin() -> None:
    signal = episode_returns("signal", 6, seed=100)
    random = episode_returns("random", 6, seed=100)
    assert np.mean(random) < -1.0
    assert np.mean(signal) > 2.0
    assert min(signal) > max(random)


def test_registered_id_and_feature_floor() -> None:
    register_market()
    register_market()  # idempotent
    env = gym.make(ENV_ID, features=16, horizon=8)
    assert env.observation_space.shape == (16,)
    with pytest.raises(ValueError, match="market_features must be >= 14"):
        MarketEnv(features=8)
