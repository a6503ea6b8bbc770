"""The Gymnasium source: specs, epsilon-greedy, what collection stores, evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from contracts.config import ConfigError
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.gym_source import (
    GymSource,
    VectorKind,
    _make_env,
    env_spec,
    epsilon_greedy,
    linear_epsilon,
    make_env_fn,
)
from trainer.execution.data.process_env import ProcessVectorEnv

from .conftest import GOAL_ID, MULTI_ID, PLANTED_MODULE


class Spaces(gym.Env[Any, Any]):
    """Just spaces, to ask env_spec about them."""

    def __init__(self, observation: gym.Space[Any], action: gym.Space[Any]) -> None:
        self.observation_space = observation
        self.action_space = action


BOX = gym.spaces.Box(-1, 1, shape=(2, 3))


def test_discrete_and_multidiscrete_specs() -> None:
    cartpole = GymSource("CartPole-v1", 2, 0, "cpu")
    assert (cartpole.spec.obs_dim, cartpole.spec.branches, cartpole.spec.actions) == (4, 1, 2)
    assert cartpole.spec.goal is None
    multi = env_spec(Spaces(BOX, gym.spaces.MultiDiscrete([4, 4, 4])))
    assert (multi.obs_dim, multi.branches, multi.actions) == (6, 3, 4)


@pytest.mark.parametrize(
    ("observation", "action", "message"),
    [
        (BOX, gym.spaces.Box(-1, 1, shape=(1,)), "action space Box.* is not supported"),
        (BOX, gym.spaces.MultiDiscrete([2, 3]), r"MultiDiscrete action sizes \[2, 3\] differ"),
        (BOX, gym.spaces.MultiDiscrete([[2, 2], [2, 2]]), "is not supported"),
        (BOX, gym.spaces.Discrete(1), "fewer than 2 actions"),
        (gym.spaces.Discrete(4), gym.spaces.Discrete(2), "observation space Discrete.* is not supported"),
    ],
)
def test_unsupported_spaces_raise_one_line_config_errors(
    observation: gym.Space[Any], action: gym.Space[Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        env_spec(Spaces(observation, action), "my-env")
    assert "\n" not in str(error.value) and str(error.value).startswith("my-env: ")


def test_unknown_env_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown Gymnasium environment 'NoSuchEnv-v9'"):
        GymSource("NoSuchEnv-v9", 1, 0, "cpu")


def test_epsilon_greedy_mixes_per_env_and_schedule_is_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    greedy = torch.full((4000, 3), 1)
    assert torch.equal(epsilon_greedy(greedy, 0.0, 5, gen), greedy)
    mixed = epsilon_greedy(greedy, 0.5, 5, gen)
    changed = (mixed != 1).any(1).float().mean()  # a random row keeps all-ones with prob 1/125
    assert abs(float(changed) - 0.5 * (1 - 1 / 125)) < 0.03
    uniform = epsilon_greedy(greedy, 1.0, 5, gen)
    assert torch.bincount(uniform.flatten(), minlength=5).min() > 2000
    assert linear_epsilon(0, 1.0, 0.1, 100) == 1.0
    assert linear_epsilon(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_epsilon(500, 1.0, 0.1, 100) == pytest.approx(0.1)


MODES: list[tuple[VectorKind, AutoresetMode]] = [
    ("sync", AutoresetMode.SAME_STEP),
    ("sync", AutoresetMode.NEXT_STEP),
    ("async", AutoresetMode.SAME_STEP),
    ("async", AutoresetMode.NEXT_STEP),
    ("process", AutoresetMode.SAME_STEP),
    ("process", AutoresetMode.NEXT_STEP),
]
KINDS = {"sync": SyncVectorEnv, "async": AsyncVectorEnv, "process": ProcessVectorEnv}


@pytest.mark.parametrize(("vector", "autoreset"), MODES)
def test_collection_stores_done_on_termination_only_and_real_final_obs(
    vector: VectorKind, autoreset: AutoresetMode
) -> None:
    # terminates on action (2, 2), truncated after 5 steps
    source = GymSource(MULTI_ID, 3, 0, "cpu", vector=vector, autoreset=autoreset)
    assert isinstance(source.envs, KINDS[vector])
    gen = torch.Generator().manual_seed(1)
    rows = [source.collect(None, 1.0, gen) for _ in range(60)]
    source.close()
    action = torch.cat([r.action for r in rows])
    done = torch.cat([r.done for r in rows])
    last = torch.cat([r.last for r in rows])
    step = torch.cat([r.episode_step for r in rows if r.episode_step is not None])
    next_obs = torch.cat([r.next_obs for r in rows])
    terminated = (action == 2).all(1)
    assert torch.equal(done, terminated.float())
    truncated = last & ~terminated
    assert truncated.any() and terminated.any()
    assert (step[truncated] == 4).all()
    assert torch.equal(last, terminated | (step == 4))
    # next_obs is the env's real successor (t = step + 1), also on the last row of an episode
    assert torch.equal(next_obs[:, 0], (step + 1).float())
    assert torch.equal(next_obs[:, 1], action[:, 0].float())
    # the next obs after an episode ends is a fresh reset (t = 0), and only then (no reset-step rows)
    obs = torch.cat([r.obs for r in rows[1:]])
    assert torch.equal(obs[:, 0] == 0, last[:-3])
    assert torch.equal(obs[~last[:-3], 0], next_obs[:-3][~last[:-3], 0])
    returns = source.finished_returns
    assert len(returns) == int(last.sum())


@pytest.mark.parametrize(
    ("env_id", "kwargs"), [(MULTI_ID, None), (GOAL_ID, None), ("foxhunt/Market-v0", {"features": 16, "horizon": 8})]
)
def test_every_vector_env_and_autoreset_mode_collects_the_same_rows(env_id: str, kwargs: dict | None) -> None:
    """Same seed, same rows, whether envs step in turn, in a worker each or in one worker, reset same-step or
    next-step."""

    def trace(vector: VectorKind, autoreset: AutoresetMode) -> list[torch.Tensor]:
        source = GymSource(env_id, 3, 4, "cpu", kwargs, vector=vector, autoreset=autoreset)
        gen = torch.Generator().manual_seed(2)
        out = []
        for _ in range(40):
            r = source.collect(None, 1.0, gen)
            assert r.episode_step is not None
            out += [r.obs, r.action, r.reward, r.next_obs, r.done, r.last, r.episode_step]
        source.close()
        return out

    reference = trace(*MODES[0])
    assert bool(torch.cat([reference[5 + 7 * t] for t in range(40)]).any())  # episodes did end
    for mode in MODES[1:]:
        for expected, got in zip(reference, trace(*mode), strict=True):
            assert torch.equal(expected, got), mode


def test_start_and_finish_collect_pair_up() -> None:
    source = GymSource(MULTI_ID, 2, 0, "cpu", vector="async")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="without start_collect"):
        source.finish_collect()
    source.start_collect(None, 1.0, gen)  # the workers step while this process is free
    with pytest.raises(RuntimeError, match="called twice"):
        source.start_collect(None, 1.0, gen)
    rows = source.finish_collect()
    assert len(rows) == 2 and rows.episode_step is not None and rows.episode_step.tolist() == [0, 0]
    source.close()


def test_goal_dict_env_spec_collection_and_her() -> None:
    source = GymSource(GOAL_ID, 2, 0, "cpu")
    spec = source.spec
    assert spec.obs_dim == 4 and spec.goal is not None
    assert (spec.goal.achieved, spec.goal.desired) == (slice(2, 3), slice(3, 4))
    assert not spec.goal.capturable  # wraps the env's NumPy compute_reward
    gen = torch.Generator().manual_seed(0)
    rows = source.collect(lambda obs: torch.full((obs.shape[0], 1), 2), 0.0, gen)  # move right
    assert rows.achieved_goal is not None and rows.base_reward is not None
    assert rows.achieved_goal[:, 0].tolist() == [1.0, 1.0]
    assert torch.equal(rows.base_reward, torch.zeros(2))  # all reward is goal reward here
    from contracts.config import build_config

    config = build_config(
        {"replay": {"capacity": 64, "her_ratio": 1.0}, "data": {"num_envs": 2}, "run": {"batch_size": 8}}
    )
    buffer = ReplayBuffer(config, spec, "cpu", gen)
    buffer.add(rows)
    for _ in range(6):
        buffer.add(source.collect(lambda obs: torch.full((obs.shape[0], 1), 2), 0.0, gen))
    batch = buffer.sample(64, 0)
    achieved = buffer.storage.achieved_goal[batch.index, 0]
    expected = -((achieved - batch.obs[:, 3]).abs() >= 0.5).float()
    torch.testing.assert_close(batch.reward, expected)
    assert (batch.obs[:, 3] >= achieved).all()  # a later position on a rightward walk


def test_evaluate_returns_undiscounted_greedy_returns() -> None:
    source = GymSource(MULTI_ID, 1, 0, "cpu")
    always_two = source.evaluate(lambda obs: torch.full((obs.shape[0], 2), 2), 3, seed=0)
    assert always_two == [4.0, 4.0, 4.0]  # terminates at once with reward 2 + 2
    zeros = source.evaluate(lambda obs: torch.zeros(obs.shape[0], 2, dtype=torch.int64), 2, seed=0)
    assert zeros == [0.0, 0.0]  # runs to the 5-step truncation with reward 0
    cartpole = GymSource("CartPole-v1", 1, 0, "cpu")
    left = cartpole.evaluate(lambda obs: torch.zeros(obs.shape[0], 1, dtype=torch.int64), 4, seed=7)
    assert all(5 <= r < 30 for r in left)
    # episode i is CartPole seeded 7 + i, pushed left until it falls
    expected = []
    for i in range(4):
        env = gym.make("CartPole-v1")
        env.reset(seed=7 + i)
        steps, over = 0, False
        while not over:
            _, _, terminated, truncated, _ = env.step(0)
            steps, over = steps + 1, terminated or truncated
        expected.append(float(steps))
    assert left == expected


def test_a_module_qualified_env_id_never_reaches_gymnasium(planted: Path) -> None:
    """Gymnasium imports `module` of an id `module:Name` (issue 29): refused by name before gym.spec and gym.make,
    also in `_make_env`, the constructor vector-env workers call, so the planted module never runs."""
    env_id = f"{PLANTED_MODULE}:Env"
    calls = {
        "source": lambda: GymSource(env_id, 1, 0, "cpu"),
        "make_env_fn": lambda: make_env_fn(env_id),
        "_make_env": lambda: _make_env(env_id, {}),
    }
    for name, call in calls.items():
        with pytest.raises(ConfigError, match=r"is module-qualified \(module:Name\): Gymnasium would import"):
            call()
        assert not planted.exists(), f"{name} imported {PLANTED_MODULE}"


@pytest.mark.parametrize("env_id", ["CartPole v1", "../CartPole-v1", "CartPole-v1\n"])
def test_an_id_not_of_a_registered_ids_form_is_refused_by_name(env_id: str) -> None:
    with pytest.raises(ConfigError, match="is not a registered Gymnasium id"):
        _make_env(env_id, {})
