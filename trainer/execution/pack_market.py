"""The torch market's envs of a pack's K runs as one batch of K x N envs on the device (issue 31).

Run by run, a pack of 16 market runs stepped 16 markets of 32 envs a collection step, each a few dozen small
kernels and their Python (on an H100, 1.10x one solo run's updates/s: docs/benchmarks/README.md, packs round 4).
The market's transition is per env (`MarketDynamics`: elementwise, and sums over an env's 3 assets), so the K
markets are one market of K x N envs whose state rows i N .. (i + 1) N are run i's: one transition a step for
all runs. What stays per run is randomness: each market draws its noise from its own generator into its rows of
the stacked noise (K pairs of draw kernels), so env j of run i sees the numbers its solo market draws, and
steps as it would alone (bit for bit on the CPU: `tests/trainer/execution/test_pack_market.py`).

The runs' own `TorchMarket`s and sources keep working on their rows: their state, noise and returns become
views of the stacked tensors, as a pack's runs' parameters are views of its stacked ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import numpy as np
import torch
from torch import Tensor

from contracts.packs import PackError
from trainer.algo.rng import NORMAL, UNIFORM, rows_draw_
from trainer.execution.data.market_torch import (
    MarketNoise,
    MarketState,
    MarketStep,
    TorchMarket,
    TorchMarketSource,
    accumulate_returns,
)
from trainer.execution.data.spec import goal_columns
from trainer.execution.pack_envs import GreedyPack, PackRows


class StackedMarkets:
    """K markets of N envs each stepping as one market of K x N envs; market i's tensors become its rows."""

    def __init__(self, markets: Sequence[TorchMarket]) -> None:
        first = markets[0]
        for market in markets[1:]:
            if (market.params, market.num_envs, market.device, market.dynamics.dtype) != (
                first.params,
                first.num_envs,
                first.device,
                first.dynamics.dtype,
            ):
                raise PackError("a pack's markets step as one only with the same parameters, envs, device and dtype")
        self.runs, self.num_envs, self.params = len(markets), first.num_envs, first.params
        self.dynamics = first.dynamics
        self.generators = [market.generator for market in markets]
        total = self.runs * self.num_envs
        self.state = self.dynamics.empty_state(total)
        self.noise = MarketNoise(total, self.params.obs_noise, first.device, first.dynamics.dtype)
        for i, market in enumerate(markets):
            for f in fields(MarketState):
                setattr(market.state, f.name, self.adopt(i, getattr(self.state, f.name), getattr(market.state, f.name)))
            market.noise.normal = self.adopt(i, self.noise.normal, market.noise.normal)
            market.noise.uniform = self.adopt(i, self.noise.uniform, market.noise.uniform)

    def rows(self, i: int) -> slice:
        return slice(i * self.num_envs, (i + 1) * self.num_envs)

    def adopt(self, i: int, stacked: Tensor, own: Tensor) -> Tensor:
        """Run i's rows of `stacked`, holding `own`'s values: what run i's market reads and writes from now on."""
        rows = stacked[self.rows(i)]
        rows.copy_(own)
        return rows

    def step(self, action: Tensor, ended: bool) -> MarketStep:
        """Every env stepped with `action` [K N, 3] (`ended`: every episode ends at this step, see
        `MarketDynamics.step`); each market's noise drawn from its own generator first, as `TorchMarket.step` does.
        The step's `obs` is the state's, overwritten by the step (callers keep their own copy)."""
        rows_draw_(self.noise.normal.view(self.runs, -1), self.generators, NORMAL)  # [K, N C]: run i's rows
        rows_draw_(self.noise.uniform.view(self.runs, -1), self.generators, UNIFORM)
        after, out = self.dynamics.step(self.state, action, self.noise, ended)
        self.state.copy_(after)
        return out

    def observations(self) -> Tensor:
        """The state's observations by market [K, N, F] (a view: the next step overwrites it)."""
        return self.state.obs.view(self.runs, self.num_envs, -1)


class MarketPackEnvs:
    """The K runs' torch markets (`TorchMarketSource`) as one `StackedMarkets`; every market steps every step
    (a frozen run's too, with actions 0: its rows are not stored, its replay and explore generator stay as they
    were), all of them at the same episode step, so the host knows when their episodes end."""

    def __init__(self, sources: Sequence[TorchMarketSource]) -> None:
        first = sources[0]
        if any(source.episode_step != first.episode_step for source in sources):
            raise PackError("a pack's markets step as one from the same episode step")
        self.sources, self.spec, self.horizon = list(sources), first.spec, first.params.horizon
        self.device, self.dtype = first.device, first.dtype
        self.markets = StackedMarkets([source.market for source in sources])
        k, n = len(sources), first.num_envs
        self.running = torch.zeros(k * n, device=self.device)  # [K N] each episode's return so far
        self.ended = torch.zeros(k * n, device=self.device)  # [K N] the returns of the episodes that ended last
        for i, source in enumerate(sources):
            rows = self.markets.rows(i)
            source.returns_over(self.running[rows], self.ended[rows])

    def observe(self, live: Sequence[int], index: Tensor) -> Tensor:
        return self.markets.observations()[index]  # [L, N, F], a copy (an indexed read)

    @property
    def episode_step(self) -> int:
        """The step every market is at in its episode (the host's counter)."""
        return self.sources[0].episode_step

    def step(self, live: Sequence[int], index: Tensor, obs: Tensor, action: Tensor) -> PackRows:
        last = self.episode_step + 1 >= self.horizon
        rows = self.step_rows(live, index, obs, action, last)
        self.advance(1, ended=last)
        return rows

    def step_rows(self, live: Sequence[int], index: Tensor, obs: Tensor, action: Tensor, last: bool) -> PackRows:
        """`step`'s device work, for a step whose episodes end iff `last` (capturable: no host value read)."""
        k, n = self.markets.runs, self.markets.num_envs
        if len(live) == k:
            every = action.reshape(k * n, -1)  # [K N, 3]
        else:
            every = torch.zeros((k, n, action.shape[-1]), dtype=action.dtype, device=self.device)
            every[index] = action
            every = every.view(k * n, -1)
        out = self.markets.step(every, ended=last)
        accumulate_returns(self.running, self.ended, out.reward, last)

        def live_rows(column: Tensor) -> Tensor:
            by_run = column.view(k, n, *column.shape[1:])
            return by_run if len(live) == k else by_run[index]

        next_obs, reward = live_rows(out.next_obs), live_rows(out.reward)  # [L, N, F], [L, N]
        rows = PackRows(
            next_obs,
            reward,
            done=live_rows(out.terminated).to(torch.float32),
            last=np.full((len(live), n), last),
        )
        if self.spec.goal is None:
            return rows
        flat = len(live) * n
        achieved, base = goal_columns(self.spec, obs.reshape(flat, -1), next_obs.reshape(flat, -1), reward.reshape(-1))
        return rows._replace(achieved_goal=achieved.view(len(live), n, -1), base_reward=base.view(len(live), n))

    def advance(self, steps: int, ended: bool) -> None:
        """The host's part of `steps` steps (`step_rows`): every source's episode step counter, and the returns of
        the episodes that `ended` among them (at most one end), to read back (views of `ended`)."""
        for source in self.sources:
            source.advance(steps, ended=ended)

    def generators(self) -> list[torch.Generator]:
        return list(self.markets.generators)

    def device_state(self) -> list[Tensor]:
        """Every tensor `step_rows` writes (the markets' state and noise, the returns), for a capture to restore."""
        state = [getattr(self.markets.state, f.name) for f in fields(MarketState)]
        return [*state, self.markets.noise.normal, self.markets.noise.uniform, self.running, self.ended]

    def evaluate(
        self, runs: Sequence[int], episodes: int, seeds: Sequence[int], online: Tensor, greedy: GreedyPack
    ) -> list[list[float]]:
        """`TorchMarketSource.evaluate` of every run at once: run r's episodes are a fresh market of `episodes` envs
        seeded seeds[r], all of them one `StackedMarkets`, one greedy forward of every run a step."""
        params, rng = self.sources[0].params, self.sources[0].rng  # keyed: each draw one launch for every run
        markets = StackedMarkets([TorchMarket(episodes, seed, self.device, params, self.dtype, rng) for seed in seeds])
        total = torch.zeros(len(runs) * episodes, device=self.device)  # [R E]
        with torch.no_grad():
            for t in range(self.horizon):
                action = greedy(online, markets.observations()).to(torch.int64)  # [R, E, 3]
                total += markets.step(action.reshape(len(runs) * episodes, -1), t + 1 == self.horizon).reward
        return [[float(value) for value in row] for row in total.view(len(runs), episodes).tolist()]
