"""A built-in synthetic market: learnable, not trivial, goal-conditioned, seeded.

Three assets; each step the agent picks a target position per asset in {-1, -0.5, 0, 0.5, 1}
(MultiDiscrete([5, 5, 5])). Returns follow a hidden, partly predictable process:

    a_{t+1}   = rho * a_t + sqrt(1 - rho^2) * eta          latent alpha per asset, stationary N(0, 1)
    z_t       in {+1, -1}, flips with prob `switch`         regime: momentum (+1) / mean reversion (-1)
    r_{t+1}   = edge * z_t * a_t + sigma * eps              the asset's return

The features show a_t and z_t through noise (plus trailing returns, distractors and pure noise), so
a good policy trades sign(z * a). The reward of a step with new positions x and old positions x0 is

    reward = sum_i x_i r_i - cost * sum_i |x_i - x0_i| + goal_reward(x, g)
    goal_reward(x, g) = -goal_coef * sum_i |x_i - g_i|

where g (one per episode, drawn from the action grid) is the desired exposure, shown in the features.
A random policy pays costs and the goal penalty for nothing (clearly negative); following the
signals earns clearly positive reward. Feature layout (F >= MIN_FEATURES):

    [0:3] positions x (the achieved goal, in next_obs)    [3:6] desired goal g
    [6] steps left / horizon                               [7] regime z + noise
    [8:11] alpha a + noise                                 [11:14] last return / sigma
    [14:] cycling: alpha + more noise, trailing mean return / sigma, regime + more noise, pure noise
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from torch import Tensor

from trainer.execution.data.spec import GoalSpec

ENV_ID = "foxhunt/Market-v0"
ASSETS = 3
LEVELS = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])
MIN_FEATURES = 14
POSITIONS = slice(0, ASSETS)
GOAL = slice(ASSETS, 2 * ASSETS)
GOAL_COEF = 0.004


def goal_reward(achieved: Tensor, desired: Tensor, coef: float = GOAL_COEF) -> Tensor:
    """-coef * sum_i |achieved_i - desired_i| over the last dim ([..., G] -> [...])."""
    return -coef * (achieved - desired).abs().sum(-1)


def goal_reward_np(achieved: np.ndarray, desired: np.ndarray, coef: float = GOAL_COEF) -> np.ndarray:
    """NumPy twin of `goal_reward`, used by the env itself."""
    return -coef * np.abs(achieved - desired).sum(-1)


def market_goal_spec() -> GoalSpec:
    """Desired exposure at obs[3:6]; achieved exposure (positions) at next_obs[0:3]."""
    return GoalSpec(desired=GOAL, achieved=POSITIONS, goal_reward=goal_reward)


class MarketEnv(gym.Env[np.ndarray, np.ndarray]):
    """The synthetic market (see the module docstring); episodes are truncated after `horizon` steps."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(
        self,
        features: int = 64,
        horizon: int = 200,
        *,
        rho: float = 0.95,
        switch: float = 0.02,
        edge: float = 0.03,
        sigma: float = 0.05,
        cost: float = 0.004,
        goal_coef: float = GOAL_COEF,
    ) -> None:
        if features < MIN_FEATURES:
            raise ValueError(f"data.market_features must be >= {MIN_FEATURES} for the market env, got {features}")
        if horizon < 1:
            raise ValueError(f"data.market_horizon must be >= 1, got {horizon}")
        self.features = features
        self.horizon = horizon
        self.rho, self.switch, self.edge, self.sigma = rho, switch, edge, sigma
        self.cost, self.goal_coef = cost, goal_coef
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(features,), dtype=np.float32)
        self.action_space = gym.spaces.MultiDiscrete([len(LEVELS)] * ASSETS)
        self._extra = features - MIN_FEATURES
        self._reset_state()

    def _reset_state(self) -> None:
        self.t = 0
        self.alpha = np.zeros(ASSETS)
        self.regime = 1.0
        self.position = np.zeros(ASSETS)
        self.goal = np.zeros(ASSETS)
        self.last_return = np.zeros(ASSETS)
        self.trailing = np.zeros(ASSETS)

    def goal_spec(self) -> GoalSpec:
        """How the trainer finds this env's goal (read by the gym source)."""
        coef = self.goal_coef
        return GoalSpec(desired=GOAL, achieved=POSITIONS, goal_reward=lambda a, d: goal_reward(a, d, coef))

    def _observe(self) -> np.ndarray:
        rng = self.np_random
        core = np.concatenate(
            [
                self.position,
                self.goal,
                [(self.horizon - self.t) / self.horizon],
                [self.regime + rng.normal(0.0, 0.6)],
                self.alpha + rng.normal(0.0, 0.5, ASSETS),
                self.last_return / self.sigma,
            ]
        )
        cycle = [
            lambda: self.alpha + rng.normal(0.0, 1.0, ASSETS),
            lambda: self.trailing / self.sigma,
            lambda: np.array([self.regime + rng.normal(0.0, 1.5)]),
            lambda: rng.normal(0.0, 1.0, 2),
        ]
        extra: list[np.ndarray] = []
        size = 0
        while size < self._extra:
            part = cycle[len(extra) % len(cycle)]()
            extra.append(part)
            size += part.size
        tail = np.concatenate(extra)[: self._extra] if extra else np.zeros(0)
        return np.concatenate([core, tail]).astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        self._reset_state()
        self.alpha = rng.normal(0.0, 1.0, ASSETS)
        self.regime = float(rng.choice([-1.0, 1.0]))
        self.goal = rng.choice(LEVELS, ASSETS)
        return self._observe(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        rng = self.np_random
        target = LEVELS[np.asarray(action, dtype=np.int64)]
        ret = self.edge * self.regime * self.alpha + self.sigma * rng.normal(0.0, 1.0, ASSETS)
        pnl = float(target @ ret)
        costs = self.cost * float(np.abs(target - self.position).sum())
        goal_term = float(goal_reward_np(target, self.goal, self.goal_coef))
        self.position = target
        self.last_return = ret
        self.trailing = 0.8 * self.trailing + 0.2 * ret
        self.alpha = self.rho * self.alpha + np.sqrt(1.0 - self.rho**2) * rng.normal(0.0, 1.0, ASSETS)
        if rng.random() < self.switch:
            self.regime = -self.regime
        self.t += 1
        truncated = self.t >= self.horizon
        info = {"pnl": pnl, "costs": costs, "goal_reward": goal_term}
        return self._observe(), pnl - costs + goal_term, False, truncated, info


def signal_policy(obs: np.ndarray) -> np.ndarray:
    """A heuristic that follows the visible signals: target sign(regime) * alpha, on the grid ([N, F] -> [N, 3])."""
    view = np.sign(obs[:, 7:8]) * obs[:, 8:11]  # [N, 3]
    target = np.clip(np.round(view * 2.0) / 2.0, -1.0, 1.0)
    return np.rint((target + 1.0) * 2.0).astype(np.int64)


def register_market() -> None:
    """Register `foxhunt/Market-v0` with Gymnasium (idempotent; called by the sources, not at import)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="trainer.execution.data.market:MarketEnv")
