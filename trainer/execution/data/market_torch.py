"""The synthetic market of `trainer.execution.data.market` as torch tensors: N envs stepping on one device.

The dynamics, features and rewards are those of `MarketEnv` (see that module's docstring), written as
pure tensor functions of a state and a block of pre-drawn noise, so that acting, stepping and storing
need no host round trip and can be captured in a CUDA graph with the updates (PureJaxRL's recipe):

- static shapes: every step draws the noise of a step *and* of a reset for all N envs (two RNG
  launches into fixed buffers), whether or not an env ends;
- no Python branch on a tensor value and no `.item()`: ended envs are reset with `torch.where`;
- state lives in fixed tensors updated in place (`copy_`), so a captured graph replays on them.

Randomness comes from one `torch.Generator` on the env's device. Its draws are mapped to the NumPy
env's as follows (the test drives both from the same numbers): a normal N(0, s) is s * z with z a
standard normal, `rng.random()` is a uniform u, and `rng.choice(a)` is a[floor(u * len(a))].
With a float64 state (the default) the two envs agree to rounding; float32 trades that for speed.

Episodes have no termination and last exactly `horizon` steps; all N envs start together, so they
also end together and the host knows which rows are last without reading the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from trainer.algo.rng import make_generator, normal_, uniform_
from trainer.execution.data.gym_source import GreedyFn, epsilon_greedy
from trainer.execution.data.market import ASSETS, GOAL, LEVELS, MIN_FEATURES, POSITIONS, MarketEnv, goal_reward
from trainer.execution.data.spec import EnvSpec, GoalSpec, Transitions, goal_columns

EXTRA_CYCLE: tuple[tuple[str, int, float], ...] = (
    ("alpha", ASSETS, 1.0),
    ("trailing", ASSETS, 0.0),
    ("regime", 1, 1.5),
    ("noise", 2, 1.0),
)
"""The features past MIN_FEATURES, cycled in this order: (what, size, noise scale), as MarketEnv._observe."""

CORE_NOISE = 1 + ASSETS
"""Standard normals of the core features: the regime's, then one per asset for alpha."""


def extra_parts(extra: int) -> list[tuple[str, int, float]]:
    """The parts MarketEnv concatenates for `extra` features; the last one may be cut short."""
    parts: list[tuple[str, int, float]] = []
    size = 0
    while size < extra:
        part = EXTRA_CYCLE[len(parts) % len(EXTRA_CYCLE)]
        parts.append(part)
        size += part[1]
    return parts


@dataclass(frozen=True)
class MarketParams:
    """The market's constants (those of a `MarketEnv`, whose constructor validates and defaults them)."""

    features: int
    horizon: int
    rho: float
    switch: float
    edge: float
    sigma: float
    cost: float
    goal_coef: float

    @classmethod
    def of(cls, features: int = 64, horizon: int = 200, **kwargs: float) -> MarketParams:
        """The params of `MarketEnv(features, horizon, **kwargs)` (same defaults, same errors)."""
        env = MarketEnv(features, horizon, **kwargs)
        return cls(**{f.name: getattr(env, f.name) for f in fields(cls)})

    @property
    def obs_noise(self) -> int:
        """O, standard normals per observation: the core ones plus one per extra feature."""
        return CORE_NOISE + self.features - MIN_FEATURES


@dataclass
class MarketState:
    """The N envs' state; `obs` is what the agent sees next (float32)."""

    t: Tensor  # [N] int64, steps taken in the episode
    alpha: Tensor  # [N, 3] latent alpha
    regime: Tensor  # [N] +1 momentum / -1 mean reversion
    position: Tensor  # [N, 3] held positions (the achieved goal)
    goal: Tensor  # [N, 3] desired exposure
    last_return: Tensor  # [N, 3]
    trailing: Tensor  # [N, 3] exponential mean of returns
    obs: Tensor  # [N, F] float32

    def copy_(self, other: MarketState) -> None:
        """Overwrite every tensor in place (keeps the storage a captured graph reads)."""
        for f in fields(self):
            getattr(self, f.name).copy_(getattr(other, f.name))


class MarketNoise:
    """One step's random numbers for N envs, in two fixed buffers filled by two RNG launches.

    normal [N, 6 + 2 O + 3]: ret | alpha | obs | reset_alpha | reset_obs; uniform [N, 5]:
    switch | reset_regime | reset_goal.
    """

    def __init__(self, num_envs: int, obs_noise: int, device: torch.device, dtype: torch.dtype) -> None:
        self.obs_noise = obs_noise
        self.normal = torch.zeros(num_envs, 3 * ASSETS + 2 * obs_noise, device=device, dtype=dtype)
        self.uniform = torch.zeros(num_envs, 2 + ASSETS, device=device, dtype=dtype)

    def draw_(self, generator: torch.Generator) -> None:
        normal_(self.normal, generator)
        uniform_(self.uniform, generator)

    @property
    def ret(self) -> Tensor:
        return self.normal[:, :ASSETS]

    @property
    def alpha(self) -> Tensor:
        return self.normal[:, ASSETS : 2 * ASSETS]

    @property
    def obs(self) -> Tensor:
        return self.normal[:, 2 * ASSETS : 2 * ASSETS + self.obs_noise]

    @property
    def reset_alpha(self) -> Tensor:
        start = 2 * ASSETS + self.obs_noise
        return self.normal[:, start : start + ASSETS]

    @property
    def reset_obs(self) -> Tensor:
        return self.normal[:, 3 * ASSETS + self.obs_noise :]

    @property
    def switch(self) -> Tensor:
        return self.uniform[:, 0]

    @property
    def reset_regime(self) -> Tensor:
        return self.uniform[:, 1]

    @property
    def reset_goal(self) -> Tensor:
        return self.uniform[:, 2:]


@dataclass
class MarketStep:
    """What one step of N envs yields (all on the env's device)."""

    obs: Tensor  # [N, F] float32, the observation acted on
    action: Tensor  # [N, 3] int64
    reward: Tensor  # [N] float32
    next_obs: Tensor  # [N, F] float32, the true successor (the final obs when the episode ended)
    terminated: Tensor  # [N] bool, always False (the market only truncates)
    truncated: Tensor  # [N] bool


class MarketDynamics:
    """The market's transition as pure functions of (state, action, noise) on one device and dtype."""

    def __init__(self, params: MarketParams, device: torch.device, dtype: torch.dtype = torch.float64) -> None:
        self.params = params
        self.device = device
        self.dtype = dtype
        self.levels = torch.tensor(LEVELS, device=device, dtype=dtype)  # [5]
        # extra feature j = source[:, extra_source[j]] + extra_scale[j] * z_j, source = [alpha | trailing/sigma
        # | regime | 0]; the j-th extra noise is column CORE_NOISE + j of the observation's noise
        extra = params.features - MIN_FEATURES
        offsets = {"alpha": 0, "trailing": ASSETS, "regime": 2 * ASSETS, "noise": 2 * ASSETS + 1}
        parts = extra_parts(extra)
        source = [
            offsets[kind] + (i if kind in ("alpha", "trailing") else 0) for kind, size, _ in parts for i in range(size)
        ]
        scale = [s for _, size, s in parts for _ in range(size)]
        self.extra_source = torch.tensor(source[:extra], device=device, dtype=torch.int64)  # [X]
        self.extra_scale = torch.tensor(scale[:extra], device=device, dtype=dtype)  # [X]

    def empty_state(self, num_envs: int) -> MarketState:
        def zeros(*shape: int) -> Tensor:
            return torch.zeros(num_envs, *shape, device=self.device, dtype=self.dtype)

        return MarketState(
            t=torch.zeros(num_envs, device=self.device, dtype=torch.int64),
            alpha=zeros(ASSETS),
            regime=zeros(),
            position=zeros(ASSETS),
            goal=zeros(ASSETS),
            last_return=zeros(ASSETS),
            trailing=zeros(ASSETS),
            obs=torch.zeros(num_envs, self.params.features, device=self.device, dtype=torch.float32),
        )

    def observe(self, state: MarketState, z: Tensor) -> Tensor:
        """The features of `state` with observation noise z [N, O] -> [N, F] float32 (MarketEnv._observe)."""
        p = self.params
        steps_left = (p.horizon - state.t).to(self.dtype) / p.horizon  # [N]
        core = torch.cat(
            [
                state.position,
                state.goal,
                steps_left[:, None],
                (state.regime + 0.6 * z[:, 0])[:, None],
                state.alpha + 0.5 * z[:, 1:CORE_NOISE],
                state.last_return / p.sigma,
            ],
            1,
        )  # [N, 14]
        zero = torch.zeros_like(state.regime)[:, None]
        source = torch.cat([state.alpha, state.trailing / p.sigma, state.regime[:, None], zero], 1)  # [N, 8]
        extra = source[:, self.extra_source] + self.extra_scale * z[:, CORE_NOISE:]  # [N, X]
        return torch.cat([core, extra], 1).to(torch.float32)  # [N, F]

    def reset(self, noise: MarketNoise) -> MarketState:
        """Fresh episodes for all N envs from the reset part of `noise` (MarketEnv.reset)."""
        n = noise.normal.shape[0]
        levels = len(LEVELS)
        state = self.empty_state(n)
        state.alpha = noise.reset_alpha.clone()
        state.regime = torch.where(noise.reset_regime < 0.5, -1.0, 1.0).to(self.dtype)  # choice([-1, 1])
        pick = (noise.reset_goal * levels).to(torch.int64).clamp_(max=levels - 1)  # [N, 3] choice(LEVELS)
        state.goal = self.levels[pick]
        state.obs = self.observe(state, noise.reset_obs)
        return state

    def step(
        self, state: MarketState, action: Tensor, noise: MarketNoise, ended: bool | None = None
    ) -> tuple[MarketState, MarketStep]:
        """One step of every env, ended ones reset in the same step (the returned state's obs is the reset's).

        `ended` None: which envs end is read from the state on the device (static shapes, capturable).
        True/False: the caller knows that every env ends at this step, or none does (they start together,
        and episodes last exactly `horizon` steps), so the reset is computed only when they end; the result
        is the same, with fewer operations on the other steps.
        """
        p = self.params
        target = self.levels[action]  # [N, 3]
        # r = edge * z * a + sigma * eps
        ret = (p.edge * state.regime)[:, None] * state.alpha + p.sigma * noise.ret  # [N, 3]
        # reward = x . r - cost * |x - x0|_1 + goal_reward(x, g)
        pnl = (target * ret).sum(1)  # [N]
        costs = p.cost * (target - state.position).abs().sum(1)  # [N]
        reward = pnl - costs + goal_reward(target, state.goal, p.goal_coef)  # [N]
        # a' = rho a + sqrt(1 - rho^2) eta; the regime flips with probability `switch`
        alpha = p.rho * state.alpha + math.sqrt(1.0 - p.rho**2) * noise.alpha
        regime = torch.where(noise.switch < p.switch, -state.regime, state.regime)
        t = state.t + 1
        moved = MarketState(
            t=t,
            alpha=alpha,
            regime=regime,
            position=target,
            goal=state.goal,
            last_return=ret,
            trailing=0.8 * state.trailing + 0.2 * ret,
            obs=state.obs,
        )
        moved.obs = self.observe(moved, noise.obs)
        truncated = t >= p.horizon  # [N]
        if ended is None:
            fresh = self.reset(noise)

            def pick(name: str) -> Tensor:
                """Per env: the fresh episode's value where the episode ended, else the moved one."""
                value = getattr(moved, name)
                done = truncated.view(-1, *([1] * (value.dim() - 1)))  # [N] or [N, 1]
                return torch.where(done, getattr(fresh, name), value)

            after = MarketState(**{f.name: pick(f.name) for f in fields(MarketState)})
        else:
            after = self.reset(noise) if ended else moved
        out = MarketStep(
            obs=state.obs,
            action=action,
            reward=reward.to(torch.float32),
            next_obs=moved.obs,
            terminated=torch.zeros_like(truncated),
            truncated=truncated,
        )
        return after, out


class TorchMarket:
    """N market envs on `device`, seeded by one generator there; `step` updates the state in place."""

    def __init__(
        self,
        num_envs: int,
        seed: int,
        device: torch.device | str,
        params: MarketParams | None = None,
        dtype: torch.dtype = torch.float64,
        rng: str = "torch",
    ) -> None:
        self.num_envs = num_envs
        self.params = params or MarketParams.of()
        self.device = torch.device(device)
        self.dynamics = MarketDynamics(self.params, self.device, dtype)
        self.generator = make_generator(seed, "market", self.device, rng)  # `run.rng`
        self.noise = MarketNoise(num_envs, self.params.obs_noise, self.device, dtype)
        self.state = self.dynamics.empty_state(num_envs)
        self.reset()

    def reset(self) -> Tensor:
        """Start every env afresh; returns the observations [N, F]."""
        self.noise.draw_(self.generator)
        self.state.copy_(self.dynamics.reset(self.noise))
        return self.state.obs

    def step(self, action: Tensor, ended: bool | None = None) -> MarketStep:
        """Step all N envs with `action` [N, 3] (indices into LEVELS); auto-resets ended envs
        (`ended`: see `MarketDynamics.step`)."""
        self.noise.draw_(self.generator)
        obs = self.state.obs.clone()  # the state's obs is overwritten below
        after, out = self.dynamics.step(self.state, action, self.noise, ended)
        out.obs = obs
        self.state.copy_(after)
        return out


def accumulate_returns(running: Tensor, ended: Tensor, reward: Tensor, last: bool) -> None:
    """Add a step's `reward` [N] to the `running` returns; at an episode's `last` step they become `ended`'s."""
    running += reward
    if last:
        ended.copy_(running)
        running.zero_()


def signal_policy(obs: Tensor) -> Tensor:
    """Torch twin of `market.signal_policy`: target sign(regime) * alpha on the grid ([N, F] -> [N, 3])."""
    view = torch.sign(obs[:, 7:8]) * obs[:, 8:11]  # [N, 3]
    target = torch.clamp(torch.round(view * 2.0) / 2.0, -1.0, 1.0)
    return torch.round((target + 1.0) * 2.0).to(torch.int64)


def random_policy(seed: int) -> GreedyFn:
    """Uniform target levels per asset, drawn from a generator seeded `seed` on the observations' device."""
    generators: dict[torch.device, torch.Generator] = {}

    def act(obs: Tensor) -> Tensor:
        generator = generators.get(obs.device)
        if generator is None:
            generator = generators[obs.device] = torch.Generator(device=obs.device).manual_seed(seed)
        return torch.randint(0, len(LEVELS), (obs.shape[0], ASSETS), device=obs.device, generator=generator)

    return act


BASELINES = ("heuristic", "random")
"""The market's reference policies: `signal_policy` (follows the visible signals) and `random_policy`."""


def baseline_returns(
    evaluate: Callable[[GreedyFn, int, int], list[float]], episodes: int, seed: int
) -> dict[str, list[float]]:
    """Each baseline's returns over the episodes `evaluate(policy, episodes, seed)` plays (a source's
    `evaluate`): with the seed of a trained policy's evaluation, the same markets, since the market's
    draws do not depend on the actions taken (a paired comparison)."""
    policies = {"heuristic": signal_policy, "random": random_policy(seed)}
    return {name: evaluate(policies[name], episodes, seed) for name in BASELINES}


def market_spec(params: MarketParams) -> EnvSpec:
    """F features, 3 branches of 5 target levels; goal at obs[3:6], achieved at next_obs[0:3]."""
    coef = params.goal_coef
    goal = GoalSpec(desired=GOAL, achieved=POSITIONS, goal_reward=lambda a, d: goal_reward(a, d, coef))
    return EnvSpec(obs_dim=params.features, branches=ASSETS, actions=len(LEVELS), goal=goal)


class TorchMarketSource:
    """The market as an online source whose envs, actions and rows stay on `device` (no host round trip).

    `collect` acts epsilon-greedily, steps the N envs and returns their rows, all as device ops; the
    rows' host-side `last` and `episode_step` come from a host step counter (every env is at the same
    step). Finished episodes' returns are kept on the device and read back only when
    `finished_returns` is read.

    `collect` is `step_rows` (the device work, which a collection graph captures: `trainer.execution.collect`)
    followed by `advance` (the host's step counter and the finished returns, which the graph's caller
    runs after each replay).
    """

    def __init__(
        self,
        num_envs: int,
        seed: int,
        device: torch.device | str,
        features: int = 64,
        horizon: int = 200,
        dtype: torch.dtype = torch.float64,
        rng: str = "torch",
        **market_kwargs: Any,
    ) -> None:
        self.device = torch.device(device)
        self.dtype, self.rng = dtype, rng
        self.params = MarketParams.of(features, horizon, **market_kwargs)
        self.market = TorchMarket(num_envs, seed, self.device, self.params, dtype, rng)
        self.spec = market_spec(self.params)
        self.num_envs = num_envs
        self._t = 0  # host mirror of every env's episode step
        self._return = torch.zeros(num_envs, device=self.device)
        self._ended = torch.zeros(num_envs, device=self.device)  # returns of the episodes that ended last
        self._pending: list[Tensor] = []
        self._finished: list[float] = []

    @property
    def finished_returns(self) -> list[float]:
        """Undiscounted returns of episodes finished during collection (reads the device when new ones ended)."""
        if self._pending:
            self._finished.extend(torch.cat(self._pending).tolist())
            self._pending.clear()
        return self._finished

    @property
    def episode_step(self) -> int:
        """The step every env is at in its episode (host counter; 0 starts an episode)."""
        return self._t

    def collect(self, greedy_fn: GreedyFn | None, epsilon: float | Tensor, generator: torch.Generator) -> Transitions:
        """Step every env once; actions epsilon-greedy around `greedy_fn` (uniform if it is None)."""
        t = self._t
        rows = self.step_rows(greedy_fn, epsilon, generator, t)
        self.advance(1, ended=t + 1 >= self.params.horizon)
        return rows

    def step_rows(
        self, greedy_fn: GreedyFn | None, epsilon: float | Tensor, generator: torch.Generator, t: int
    ) -> Transitions:
        """One step of every env at episode step `t`, as device operations only (capturable with a
        `greedy_fn` that is, and a device `epsilon`): act, step, the rows (HER columns included), the
        returns. Episodes end at this step iff t + 1 == horizon; the rows' host `last` and
        `episode_step` say so. The host counter moves on in `advance`."""
        obs = self.market.state.obs
        if greedy_fn is None:
            greedy = torch.zeros(self.num_envs, ASSETS, dtype=torch.int64, device=self.device)
            epsilon = 1.0
        else:
            greedy = greedy_fn(obs).to(torch.int64)  # [N, K]
        action = epsilon_greedy(greedy, epsilon, len(LEVELS), generator)  # [N, K]
        last = t + 1 >= self.params.horizon
        out = self.market.step(action, ended=last)
        rows = Transitions(
            obs=out.obs,
            action=action,
            reward=out.reward,
            next_obs=out.next_obs,
            done=out.terminated.to(torch.float32),
            last=torch.full((self.num_envs,), last),
            episode_step=torch.full((self.num_envs,), t, dtype=torch.int64),
        )
        rows.achieved_goal, rows.base_reward = goal_columns(self.spec, rows.obs, rows.next_obs, rows.reward)
        accumulate_returns(self._return, self._ended, out.reward, last)
        return rows

    def returns_over(self, running: Tensor, ended: Tensor) -> None:
        """Keep the running and the last ended episodes' returns in `running` and `ended` [N] from now on (a pack's
        rows of its stacked returns, which it accumulates for all its runs at once), with their current values."""
        running.copy_(self._return)
        ended.copy_(self._ended)
        self._return, self._ended = running, ended

    def device_state(self) -> list[Tensor]:
        """Every tensor `step_rows` writes (the market's state and noise, the returns), for a capture to restore."""
        market = self.market
        state = [getattr(market.state, f.name) for f in fields(market.state)]
        return [*state, market.noise.normal, market.noise.uniform, self._return, self._ended]

    def advance(self, steps: int, ended: bool) -> None:
        """The host's part of `steps` steps taken by `step_rows`: the episode step counter, and the
        returns of the episodes that `ended` among them (at most one end: `steps` <= horizon)."""
        if ended:
            self._pending.append(self._ended.clone())
        self._t = (self._t + steps) % self.params.horizon

    def evaluate(self, greedy_fn: GreedyFn, episodes: int, seed: int) -> list[float]:
        """Undiscounted returns of `episodes` greedy episodes run side by side, drawn from a generator seeded `seed`."""
        market = TorchMarket(episodes, seed, self.device, self.params, self.dtype, self.rng)
        total = torch.zeros(episodes, device=self.device)
        with torch.no_grad():
            for t in range(self.params.horizon):
                total += market.step(greedy_fn(market.state.obs).to(torch.int64), t + 1 == self.params.horizon).reward
        return [float(r) for r in total.tolist()]

    def close(self) -> None:
        """Nothing to release (the GymSource interface)."""
