"""A run's envs in one worker process (`trainer.execution.data.process_env`): the worker's failures come back as
errors that say what failed, and closing ends the worker. That its rows are the sync vector env's is checked
with every other vector env in `test_gym_source.py`."""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from trainer.execution.data.gym_source import make_env_fn
from trainer.execution.data.process_env import EnvWorkerError, Episodes, EpisodesInWorker, ProcessVectorEnv


@pytest.fixture
def envs() -> Iterator[ProcessVectorEnv]:
    envs = ProcessVectorEnv(make_env_fn("CartPole-v1"), 2, AutoresetMode.SAME_STEP)
    yield envs
    envs.close()


def test_an_error_in_the_worker_is_raised_here_with_its_message(envs: ProcessVectorEnv) -> None:
    envs.reset(seed=0)
    with pytest.raises(EnvWorkerError, match="invalid"):  # CartPole asserts its action is in its space
        envs.step(np.array([0, 7]))
    obs, reward, *_ = envs.step(np.array([0, 1]))  # the worker serves on
    assert obs.shape == (2, 4) and reward.tolist() == [1.0, 1.0]


def test_a_step_is_gathered_before_the_next_request(envs: ProcessVectorEnv) -> None:
    envs.reset(seed=0)
    envs.step_async(np.array([0, 1]))
    with pytest.raises(RuntimeError, match="while step is under way"):
        envs.reset(seed=1)
    assert envs.step_wait()[0].shape == (2, 4)
    with pytest.raises(RuntimeError, match="without step_async"):
        envs.step_wait()


def test_closing_ends_the_worker_also_mid_step() -> None:
    envs = ProcessVectorEnv(make_env_fn("CartPole-v1"), 2, AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    envs.step_async(np.array([0, 1]))
    envs.close()
    assert not envs.worker.process.is_alive() and envs.worker.process.exitcode == 0


def test_a_worker_that_died_is_named_as_such(envs: ProcessVectorEnv) -> None:
    envs.worker.process.kill()
    envs.worker.process.join()
    with pytest.raises(EnvWorkerError, match="worker process (died|is gone)"):
        envs.reset(seed=0)


def test_episodes_in_a_worker_play_as_in_this_process() -> None:
    """Greedy evaluation's envs in a worker: the same first observations and step outcomes as in this process."""
    make = make_env_fn("CartPole-v1")
    here, there = Episodes(make, [5, 6, 7]), EpisodesInWorker(make, [5, 6, 7])
    for mine, theirs in zip(here.start(), there.start(), strict=True):
        assert np.array_equal(mine, theirs)
    moves = [(0, 1), (2, 0)]  # episode 1 left out, as an ended one is
    for _ in range(5):
        there.step_async(moves)
        for mine, theirs in zip(here.step(moves), there.step_wait(), strict=True):
            assert np.array_equal(mine[0], theirs[0]) and mine[1:] == theirs[1:]
    here.close()
    there.close()
    assert not there.worker.process.is_alive()


def _broken_env() -> gym.Env[Any, Any]:
    raise ValueError("no such track (injected)")


def test_a_build_that_fails_is_raised_at_the_first_call_with_its_traceback() -> None:
    player = EpisodesInWorker(_broken_env, [1])  # making it does not wait for the build
    with pytest.raises(EnvWorkerError, match="(?s)worker process failed.*no such track"):
        player.start()
    player.close()
    assert not player.worker.process.is_alive()


def _released_env(release: Any) -> gym.Env[Any, Any]:
    if not release.wait(timeout=60):
        raise TimeoutError("not released: the workers were built one after another")
    return make_env_fn("CartPole-v1")()


def test_workers_build_side_by_side() -> None:
    """Every player's build waits for an event set only once all are made: made one after another (each waiting
    for its build), the first would never see it."""
    release = multiprocessing.get_context().Event()
    players = [EpisodesInWorker(functools.partial(_released_env, release), [i]) for i in range(3)]
    release.set()
    try:
        assert [player.start()[0].shape for player in players] == [(4,)] * 3
    finally:
        for player in players:
            player.close()
