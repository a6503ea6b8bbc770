"""The batch one update step consumes (layout fixed in docs/architecture.md, "The batch").

Letters as in docs/architecture.md ("Conventions"): B batch, K branches, F features, W window. GPU
plans sample into a static Batch allocated once (`Batch.empty`), so a captured graph always reads
the same addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor


@dataclass
class Batch:
    """Sampled transitions on the training device."""

    obs: Tensor  # [B, F] float32, goal features included
    action: Tensor  # [B, K] int64
    reward: Tensor  # [B] float32, after HER relabelling
    next_obs: Tensor  # [B, F] float32
    done: Tensor  # [B] float32, 1.0 on termination only
    window: Tensor  # [B, W, F] float32, the W states ending at obs, zeros before the episode start
    weight: Tensor  # [B] float32, PER importance weight, batch max 1
    index: Tensor  # [B] int64, replay slot for priority write-back

    @classmethod
    def empty(cls, batch_size: int, obs_dim: int, branches: int, window: int, device: torch.device | str) -> Batch:
        """A zero-filled Batch of static shapes, to be filled in place (`ReplayBuffer.sample_into`)."""
        if min(batch_size, obs_dim, branches, window) < 1:
            raise ValueError(
                f"Batch.empty needs positive sizes, got batch_size={batch_size}, obs_dim={obs_dim}, "
                f"branches={branches}, window={window}"
            )
        f32: dict[str, Any] = {"dtype": torch.float32, "device": device}
        return cls(
            obs=torch.zeros(batch_size, obs_dim, **f32),
            action=torch.zeros(batch_size, branches, dtype=torch.int64, device=device),
            reward=torch.zeros(batch_size, **f32),
            next_obs=torch.zeros(batch_size, obs_dim, **f32),
            done=torch.zeros(batch_size, **f32),
            window=torch.zeros(batch_size, window, obs_dim, **f32),
            weight=torch.ones(batch_size, **f32),
            index=torch.zeros(batch_size, dtype=torch.int64, device=device),
        )

    def copy_(self, other: Batch) -> Batch:
        """Copy `other` into this batch's buffers in place (shapes must match)."""
        for field in fields(self):
            getattr(self, field.name).copy_(getattr(other, field.name))
        return self

    def to(self, device: torch.device | str) -> Batch:
        """This batch on `device` (new tensors where the device differs)."""
        return Batch(**{field.name: getattr(self, field.name).to(device) for field in fields(self)})

    @property
    def size(self) -> int:
        """B."""
        return int(self.obs.shape[0])
