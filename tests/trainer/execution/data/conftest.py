"""Tiny registered envs with known dynamics, to check what the gym source stores; a module an env id may not import."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

MULTI_ID = "foxhunt-test/MultiToy-v0"
GOAL_ID = "foxhunt-test/GoalToy-v0"


class MultiToy(gym.Env[np.ndarray, np.ndarray]):
    """obs = [t, a0 of the last step]; MultiDiscrete([3, 3]); terminates on action (2, 2)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3, 3])
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, -1.0], dtype=np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        terminated = bool(action[0] == 2 and action[1] == 2)
        return np.array([self.t, action[0]], dtype=np.float32), float(action.sum()), terminated, False, {}


class GoalToy(gym.Env[dict, int]):
    """A walk on the integers towards a desired goal; reward -1 until |position - goal| < 0.5."""

    def __init__(self) -> None:
        box = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32),
                "achieved_goal": box,
                "desired_goal": box,
            }
        )
        self.action_space = gym.spaces.Discrete(3)
        self.position = 0.0
        self.goal = 0.0

    def _obs(self) -> dict:
        f32 = np.float32
        return {
            "observation": np.array([self.position, 1.0], dtype=f32),
            "achieved_goal": np.array([self.position], dtype=f32),
            "desired_goal": np.array([self.goal], dtype=f32),
        }

    def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        return -(np.abs(achieved - desired).sum(-1) >= 0.5).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.position = 0.0
        self.goal = float(self.np_random.integers(1, 4))
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        self.position += float(action) - 1.0
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        return obs, reward, reward == 0.0, False, {}


@pytest.fixture(scope="session", autouse=True)
def toy_envs() -> None:
    """Register the toy envs (truncated after 5 and 8 steps) once per session."""
    if MULTI_ID not in gym.registry:
        gym.register(id=MULTI_ID, entry_point=MultiToy, max_episode_steps=5)
    if GOAL_ID not in gym.registry:
        gym.register(id=GOAL_ID, entry_point=GoalToy, max_episode_steps=8)


PLANTED_MODULE = "foxhunt_planted_env"
"""A module a tenant could name in an env id `foxhunt_planted_env:Env`; its import leaves a mark."""


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The mark file of PLANTED_MODULE, which sits on sys.path: it exists once anything imported the module."""
    mark = tmp_path / "imported"
    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / f"{PLANTED_MODULE}.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(folder))
    yield mark
    sys.modules.pop(PLANTED_MODULE, None)
