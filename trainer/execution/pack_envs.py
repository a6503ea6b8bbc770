"""A pack's environments: the K runs' envs behind one interface, stepped with every live run's actions at once.

`PackCollector` (`trainer.execution.pack_collect`) acts for the live runs in one batched forward and stores their
rows with one indexed write per column; what lies between, stepping the envs, depends on where they live:

- `GymPackEnvs`: each run's Gymnasium vector env (host), stepped one after another with its own actions;
- `trainer.execution.pack_market.MarketPackEnvs`: the torch market's envs of every run as one batch on the device.

Each run keeps its own envs, seeds and episode statistics (its source's), so run i's rows are its solo run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from trainer.execution.data.gym_source import GymSource, batch_obs, flatten_obs
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
    """Each run's Gymnasium vector env: one copy of every run's actions to the host, then each run's envs stepped."""

    def __init__(self, sources: Sequence[GymSource], device: torch.device) -> None:
        self.sources, self.device = list(sources), device

    def observe(self, live: Sequence[int], index: Tensor) -> Tensor:
        return host_to_device(np.stack([self.sources[i].observation for i in live]), self.device)  # [L, N, F]

    def step(
        self, live: Sequence[int], index: Tensor, obs: Tensor, action: Tensor, into: PackRows | None = None
    ) -> PackRows:
        """`PackEnvs.step`; `into`: the rows' device columns copied into these buffers (a captured store's)."""
        host = action.cpu().numpy()
        for row, i in enumerate(live):
            self.sources[i].send(obs[row], action[row], host[row])
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

    def evaluate(
        self, runs: Sequence[int], episodes: int, seeds: Sequence[int], online: Tensor, greedy: GreedyPack
    ) -> list[list[float]]:
        """Run r's episode e is seeded seeds[r] + e in an env of its own, all of them stepped side by side, with one
        greedy forward of every run a step. Episodes that ended keep their last observation in the forward (static
        shapes) and are not stepped; their actions are not used."""
        envs = [[self.sources[i].make_env() for _ in range(episodes)] for i in runs]
        starts = zip(envs, seeds, strict=True)
        first = [[env.reset(seed=seed + e)[0] for e, env in enumerate(row)] for row, seed in starts]
        obs = np.stack([flatten_obs(batch_obs(row)) for row in first])  # [R, E, F]
        returns = np.zeros((len(runs), episodes))  # [R, E]
        active = np.ones((len(runs), episodes), dtype=bool)  # [R, E]
        with torch.no_grad():
            while active.any():
                actions = greedy(online, torch.from_numpy(obs).to(self.device)).to(torch.int64).cpu().numpy()
                for row, e in zip(*np.nonzero(active), strict=True):
                    source = self.sources[runs[row]]
                    env_action = source.env_action(actions[row, e : e + 1])[0]
                    observation, reward, terminated, truncated, _ = envs[row][e].step(env_action)
                    returns[row, e] += float(reward)
                    obs[row, e] = flatten_obs(batch_obs([observation]))[0]
                    active[row, e] = not (terminated or truncated)
        for row in envs:
            for env in row:
                env.close()
        return [[float(value) for value in row] for row in returns]
