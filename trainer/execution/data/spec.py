"""What a data source looks like to the trainer: its shapes, its goal, and the rows it produces.

`EnvSpec` fixes the model's input and output sizes (F features, K branches of A actions each) and,
for goal-conditioned data, where the goal lives in the state and how goal reward is computed, so
HER can relabel on the device. `Transitions` is the row block every source hands to the replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


class DatasetError(ValueError):
    """A dataset that cannot be used; the message is one line naming the file and the problem."""


GoalReward = Callable[[Tensor, Tensor], Tensor]
"""Vectorised goal reward: (achieved [..., G], desired [..., G]) -> [...], pure tensor ops."""


@dataclass(frozen=True)
class GoalSpec:
    """A goal-conditioned state: obs[desired] is the desired goal, next_obs[achieved] the goal reached.

    The reward of a goal-conditioned transition splits as reward = base_reward + goal_reward(achieved,
    desired); HER swaps `desired` and recomputes only the second term.
    """

    desired: slice
    achieved: slice
    goal_reward: GoalReward
    capturable: bool = True
    """False when goal_reward calls back into the host (a NumPy env's compute_reward)."""

    def __post_init__(self) -> None:
        if self.dim <= 0 or self.dim != self.achieved.stop - self.achieved.start:
            raise ValueError(f"goal slices must be non-empty and of equal size, got {self.desired} and {self.achieved}")

    @property
    def dim(self) -> int:
        """G, the goal dimension."""
        return self.desired.stop - self.desired.start


@dataclass(frozen=True)
class EnvSpec:
    """Sizes the model and replay are built with: F = obs_dim, K = branches, A = actions per branch."""

    obs_dim: int
    branches: int
    actions: int
    goal: GoalSpec | None = None

    def __post_init__(self) -> None:
        if self.obs_dim <= 0 or self.branches <= 0 or self.actions <= 1:
            raise ValueError(
                f"EnvSpec needs obs_dim > 0, branches > 0, actions > 1 (got {self.obs_dim}, "
                f"{self.branches}, {self.actions})"
            )
        if self.goal is not None and max(self.goal.desired.stop, self.goal.achieved.stop) > self.obs_dim:
            raise ValueError(f"goal slices {self.goal.desired}, {self.goal.achieved} exceed obs_dim {self.obs_dim}")


@dataclass
class Transitions:
    """N rows of experience. Tensors live on any device except `last` and `episode_step` (host).

    `done` is 1.0 only on termination; `last` marks the final row of an episode (terminated or
    truncated), which the writer's host-side episode bookkeeping reads without a device sync.
    `episode_step` is the row's position in its episode: sources fill it; `extend` reads it to find
    episode boundaries (a row with step 0 starts an episode), `add` keeps its own per-env count.
    """

    obs: Tensor  # [N, F] float
    action: Tensor  # [N, K] int64
    reward: Tensor  # [N] float32
    next_obs: Tensor  # [N, F] float
    done: Tensor  # [N] float32
    last: Tensor  # [N] bool, CPU
    episode_step: Tensor | None = None  # [N] int64, CPU
    achieved_goal: Tensor | None = None  # [N, G] float32
    base_reward: Tensor | None = None  # [N] float32

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def select(self, rows: Tensor) -> Transitions:
        """The rows `rows` (a CPU index or mask), on the devices they already live on."""

        def take(value: Tensor | None) -> Tensor | None:
            return None if value is None else value[rows.to(value.device)]

        return Transitions(
            obs=self.obs[rows.to(self.obs.device)],
            action=self.action[rows.to(self.action.device)],
            reward=self.reward[rows.to(self.reward.device)],
            next_obs=self.next_obs[rows.to(self.next_obs.device)],
            done=self.done[rows.to(self.done.device)],
            last=self.last[rows],
            episode_step=take(self.episode_step),
            achieved_goal=take(self.achieved_goal),
            base_reward=take(self.base_reward),
        )


def goal_columns(spec: EnvSpec, obs: Tensor, next_obs: Tensor, reward: Tensor) -> tuple[Tensor, Tensor]:
    """achieved_goal = next_obs[achieved]; base_reward = reward - goal_reward(achieved, obs[desired])."""
    if spec.goal is None:
        raise ValueError("goal_columns needs a goal-conditioned EnvSpec (spec.goal is None)")
    achieved = next_obs[:, spec.goal.achieved].float()  # [N, G]
    base = reward - spec.goal.goal_reward(achieved, obs[:, spec.goal.desired].float())  # [N]
    return achieved, base.to(torch.float32)
