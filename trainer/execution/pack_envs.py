"""A pack's environments: the K runs' envs behind one interface, stepped with every live run's actions at once.

`PackCollector` (`trainer.execution.pack_collect`) acts for the live runs in one batched forward and stores their
rows with one indexed write per column; what lies between, stepping the envs, depends on where they live:

- `GymPackEnvs`: each run's Gymnasium vector env (host), stepped one after another with its own actions;
- `trainer.execution.pack_market.MarketPackEnvs`: the torch market's envs of every run as one batch on the device.

Each run keeps its own envs, seeds and episode statistics (its source's), so run i's rows are its solo run's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import Tensor

from trainer.execution.data.gym_source import GymSource, HostStep, VectorStep, batch_obs, flatten_obs
from trainer.execution.data.process_env import Episodes, EpisodesInWorker
from trainer.execution.data.transfer import host_into, host_to_device

GreedyPack = Callable[[Tensor, Tensor], Tensor]
"""The runs' greedy actions: (their stacked online parameters [R, P], observations [R, E, F]) -> [R, E, K]."""


class PackRows(NamedTuple):
    """One env step of the live runs' N envs each: the columns the envs produce, on the device but `last`."""

    next_obs: Tensor  # [L, N, F]
    reward: Tensor  # [L, N] float32
    done: Tensor  # [L, N] float32
    last: np.ndarray  # [L, N] bool, host: the writers' bookkeeping reads it
    achieved_goal: Tensor | None = None  # [L, N, G] goal-conditioned envs (HER)
    base_reward: Tensor | None = None  # [L, N]


class PackEnvs(Protocol):
    """The K runs' envs, stepped with the live runs' actions at once."""

    def observe(self, live: Sequence[int], index: Tensor) -> Tensor:
        """What the live runs (`index` [L] on the device) act on next [L, N, F], a copy the step leaves as it is."""
        ...

    def step(self, live: Sequence[int], index: Tensor, obs: Tensor, action: Tensor) -> PackRows:
        """Step the live runs' envs with `action` [L, N, K], chosen on `obs` [L, N, F]; their rows."""
        ...

    def evaluate(
        self, runs: Sequence[int], episodes: int, seeds: Sequence[int], online: Tensor, greedy: GreedyPack
    ) -> list[list[float]]:
        """Each run's `episodes` greedy returns from its own seed (its source's `evaluate`), all played at once
        with `greedy` over the runs' parameters `online` [R, P]."""
        ...


class GymPackEnvs:
    """Each run's Gymnasium vector env: one copy of every run's actions to the host, then every run's envs stepped,
    as one vector env where they can be (`joint_vector_env`)."""

    def __init__(self, sources: Sequence[GymSource], device: torch.device) -> None:
        self.sources, self.device = list(sources), device
        self.joint = joint_vector_env(self.sources)

    def observe(self, live: Sequence[int], index: Tensor) -> Tensor:
        return host_to_device(np.stack([self.sources[i].observation for i in live]), self.device)  # [L, N, F]

    def step(
        self, live: Sequence[int], index: Tensor, obs: Tensor, action: Tensor, into: PackRows | None = None
    ) -> PackRows:
        """`PackEnvs.step`; `into`: the rows' device columns copied into these buffers (a captured store's)."""
        host = action.cpu().numpy()
        for row, i in enumerate(live):
            self.sources[i].send(obs[row], action[row], host[row])
        if self.joint is not None and len(live) == len(self.sources):
            steps = self.step_joint(host)
        else:  # a frozen run's envs stand still: the others' step alone, each in its own vector env
            steps = [self.sources[i].finish_step() for i in live]
        next_obs = np.stack([step.next_obs for step in steps])  # [L, N, F]
        reward = np.stack([step.reward for step in steps])  # [L, N]
        done = np.stack([step.done for step in steps])  # [L, N]
        last = np.stack([step.last for step in steps])  # [L, N]
        if into is None:
            next_t, reward_t, done_t = (host_to_device(column, self.device) for column in (next_obs, reward, done))
            return PackRows(next_t, reward_t, done_t, last=last)
        for buffer, column in zip(into[:3], (next_obs, reward, done), strict=True):
            host_into(buffer, column)
        return into._replace(last=last)

    def step_joint(self, host: np.ndarray) -> list[HostStep]:
        """Every run's envs stepped as one vector env with the runs' actions `host` [K, N, B]; each run's rows."""
        assert self.joint is not None
        n = self.sources[0].num_envs
        stepped = self.joint.step(self.sources[0].env_action(host.reshape(-1, host.shape[-1])))
        return [source.finish_step(_share(stepped, k * n, (k + 1) * n)) for k, source in enumerate(self.sources)]

    def evaluate(
        self, runs: Sequence[int], episodes: int, seeds: Sequence[int], online: Tensor, greedy: GreedyPack
    ) -> list[list[float]]:
        """Run r's episode e is seeded seeds[r] + e in an env of its own, all of them stepped side by side, with one
        greedy forward of every run a step (each run's envs in a worker process of their own where its source's are:
        the runs step in parallel). Episodes that ended keep their last observation in the forward (static shapes)
        and are not stepped; their actions are not used."""
        players: list[Episodes | EpisodesInWorker] = []
        try:  # the players made so far are closed also when making the next one fails
            for i, seed in zip(runs, seeds, strict=True):
                players.append(self.sources[i].episodes([seed + e for e in range(episodes)]))
            first = [player.start() for player in players]
            obs = np.stack([flatten_obs(batch_obs(row)) for row in first])  # [R, E, F]
            returns = np.zeros((len(runs), episodes))  # [R, E]
            active = np.ones((len(runs), episodes), dtype=bool)  # [R, E]
            to_env = self.sources[runs[0]].env_action  # the runs' envs are of one kind (one action space)
            with torch.no_grad():
                while active.any():
                    actions = greedy(online, torch.from_numpy(obs).to(self.device)).to(torch.int64).cpu().numpy()
                    env_actions = to_env(actions.reshape(-1, actions.shape[-1]))  # [R E] or [R E, K]
                    env_actions = env_actions.reshape(len(runs), episodes, *env_actions.shape[1:])
                    running = [np.flatnonzero(row) for row in active]  # each run's episodes still on
                    for row, player in enumerate(players):  # all sent before any is gathered
                        if len(running[row]):
                            player.step_async([(int(e), env_actions[row, e]) for e in running[row]])
                    for row, player in enumerate(players):
                        if not len(running[row]):
                            continue
                        for e, (observation, reward, terminated, truncated) in zip(
                            running[row], player.step_wait(), strict=True
                        ):
                            returns[row, e] += float(reward)
                            obs[row, e] = np.reshape(observation, -1)  # goal-free: a Box's, cast as `flatten_obs`
                            active[row, e] = not (terminated or truncated)
        finally:
            for player in players:
                player.close()
        return [[float(value) for value in row] for row in returns]


def joint_vector_env(sources: Sequence[GymSource]) -> SyncVectorEnv | None:
    """The runs' envs, the very objects of their own vector envs, as one vector env that steps them in one loop
    (each run's vector env costs tens of µs a step beyond its envs'); None unless every run's is `joinable`.
    A run's envs step there as its own vector env steps them: each is stepped, and reset without a seed where its
    episode ends, in the same step."""
    if len(sources) < 2 or not all(source.joinable for source in sources):
        return None
    envs = [env for source in sources for env in source.envs.envs]  # type: ignore[attr-defined]
    return SyncVectorEnv([functools.partial(_itself, env) for env in envs], autoreset_mode=AutoresetMode.SAME_STEP)


def _itself(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    return env


def _share(stepped: VectorStep, start: int, stop: int) -> VectorStep:
    """Envs start..stop's part of a vector env's step; its infos' arrays (per env) sliced alike."""
    obs, reward, terminated, truncated, info = stepped
    return (
        obs[start:stop],
        reward[start:stop],
        terminated[start:stop],
        truncated[start:stop],
        _info_share(info, start, stop),
    )


def _info_share(info: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    return {
        key: _info_share(value, start, stop) if isinstance(value, dict) else value[start:stop]
        for key, value in info.items()
    }
