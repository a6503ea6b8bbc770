"""Hindsight experience replay (Andrychowicz et al. 2017), "future" strategy, on sampled batches.

For a fraction `ratio` of the sampled rows i (episode e, step s, episode length L known so far):

    s'        ~ Uniform{s, ..., L-1}                       a step at or after s in episode e
    g'        = achieved_goal[slot of (e, s')]             slot = (serial_i + (s'-s) * stride_i) mod C
    obs[goal] = next_obs[goal] = g'   (and the goal of every real state of the row's window)
    reward    = base_reward_i + goal_reward(achieved_goal_i, g')

The future row is always still stored: it was written after row i, and the ring overwrites the
oldest rows first. Pure tensor ops: no host sync, capturable. The random numbers are drawn apart
(`draw`, from the replay's generator), so a compiled plan can compile `relabel` itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.replay.storage import TensorStorage
from trainer.algo.rng import uniform_
from trainer.execution.data.spec import GoalSpec


class HindsightRelabeler:
    """Relabels goals of sampled rows in place with goals achieved later in the same episode."""

    def __init__(self, goal: GoalSpec, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"replay.her_ratio must be in [0, 1], got {ratio}")
        self.goal = goal
        self.ratio = ratio

    @staticmethod
    def draw(batch_size: int, device: torch.device, generator: torch.Generator) -> Tensor:
        """The random numbers of one relabelling [2, B]: which rows, and how far ahead."""
        return uniform_(torch.empty(2, batch_size, device=device), generator)

    def relabel(
        self,
        storage: TensorStorage,
        index: Tensor,
        obs: Tensor,
        next_obs: Tensor,
        reward: Tensor,
        window: Tensor,
        window_valid: Tensor,
        draw: Tensor,
    ) -> Tensor:
        """Relabel the gathered obs, next_obs [B, F], reward [B] and window [B, W, F] in place, with the
        random numbers `draw` [2, B] (from `HindsightRelabeler.draw`).

        The goal is constant within an episode, so every real state of a relabelled row's window
        gets the new goal too. Returns the relabel mask [B].
        """
        relabel = draw[0] < self.ratio  # [B]
        step = storage.episode_step[index]  # [B]
        ahead = storage.lengths(index) - step  # [B] >= 1: rows from s to L-1
        # k ~ Uniform{0, ..., ahead-1}, clamped against draw == 1 - ulp rounding up
        k = torch.minimum((draw[1] * ahead).long(), ahead - 1)  # [B]
        future = (storage.serial[index] + k * storage.stride[index]).remainder(storage.capacity)  # [B]
        new_goal = storage.achieved_goal[future]  # [B, G]
        desired = self.goal.desired
        mask = relabel[:, None]  # [B, 1]
        obs[:, desired] = torch.where(mask, new_goal, obs[:, desired])
        next_obs[:, desired] = torch.where(mask, new_goal, next_obs[:, desired])
        win_mask = (relabel[:, None] & window_valid)[..., None]  # [B, W, 1]
        window[:, :, desired] = torch.where(win_mask, new_goal[:, None, :], window[:, :, desired])
        relabelled = storage.base_reward[index] + self.goal.goal_reward(storage.achieved_goal[index], new_goal)  # [B]
        reward.copy_(torch.where(relabel, relabelled.to(reward.dtype), reward))
        return relabel
