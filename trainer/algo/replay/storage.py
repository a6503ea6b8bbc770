"""Replay storage: every transition field in tensors on the training device, allocated once.

Per slot (C = capacity): obs/next_obs [C, F] (float32, or bfloat16 to halve memory; read back as
float32), action [C, K], reward [C], done [C], and the bookkeeping the window gather and HER need:

- `serial` [C]: the global write position of the row in the slot (slot = serial mod C; -1 empty).
  A slot still holds a given row iff its serial matches, which detects overwritten neighbours.
- `stride` [C]: serial distance between consecutive rows of the same episode (N for rows added by
  N parallel envs, 1 for rows loaded with `extend`), so the row k steps later is serial + k*stride.
- `episode_step` [C]: position of the row in its episode (0 = first).
- `episode_len` [C]: length of the row's episode, back-filled by the writer when it ends; -1 while
  it runs, in which case `stream_len[stream]` holds the steps written so far.
- `achieved_goal` [C, G], `base_reward` [C]: for goal-conditioned data (HER).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from trainer.execution.data.spec import EnvSpec, Transitions

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Storage(Protocol):
    """What the writer, sampler-side gathers and HER need from a storage."""

    capacity: int

    def write(self, slots: Tensor, rows: Transitions, meta: Tensor) -> None: ...

    def set_episode_len(self, slots: Tensor, length: Tensor) -> None: ...

    def set_stream_len(self, length: Tensor) -> None: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...


class TensorStorage:
    """Device tensors for `capacity` transitions of `spec`, plus per-stream running lengths."""

    META = ("serial", "stride", "stream", "episode_step", "episode_len")
    """Order of the rows of the int64 `meta` [5, N] block given to `write`."""

    def __init__(
        self, spec: EnvSpec, capacity: int, streams: int, device: torch.device | str, dtype: str = "float32"
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"replay.storage_dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if capacity < 1 or streams < 1:
            raise ValueError(f"storage needs capacity >= 1 and streams >= 1, got {capacity} and {streams}")
        self.spec = spec
        self.capacity = capacity
        self.device = torch.device(device)
        state: dict[str, Any] = {"dtype": _DTYPES[dtype], "device": self.device}
        i64: dict[str, Any] = {"dtype": torch.int64, "device": self.device}
        f32: dict[str, Any] = {"dtype": torch.float32, "device": self.device}
        self.obs = torch.zeros(capacity, spec.obs_dim, **state)
        self.next_obs = torch.zeros(capacity, spec.obs_dim, **state)
        self.action = torch.zeros(capacity, spec.branches, **i64)
        self.reward = torch.zeros(capacity, **f32)
        self.done = torch.zeros(capacity, **f32)
        self.serial = torch.full((capacity,), -1, **i64)
        self.stride = torch.ones(capacity, **i64)
        self.stream = torch.zeros(capacity, **i64)
        self.episode_step = torch.zeros(capacity, **i64)
        self.episode_len = torch.full((capacity,), -1, **i64)
        self.stream_len = torch.zeros(streams, **i64)
        goal_dim = spec.goal.dim if spec.goal is not None else 0
        self.achieved_goal = torch.zeros(capacity, goal_dim, **f32)
        self.base_reward = torch.zeros(capacity, **f32)

    def write(self, slots: Tensor, rows: Transitions, meta: Tensor) -> None:
        """Store `rows` at `slots` [N] with bookkeeping `meta` [5, N] (rows in the order of META)."""
        dev = self.device
        self.obs.index_copy_(0, slots, rows.obs.to(dev, self.obs.dtype))
        self.next_obs.index_copy_(0, slots, rows.next_obs.to(dev, self.next_obs.dtype))
        self.action.index_copy_(0, slots, rows.action.to(dev, torch.int64).reshape(len(rows), -1))
        self.reward.index_copy_(0, slots, rows.reward.to(dev, torch.float32))
        self.done.index_copy_(0, slots, rows.done.to(dev, torch.float32))
        meta = meta.to(dev, non_blocking=True)
        for row, name in enumerate(self.META):
            getattr(self, name).index_copy_(0, slots, meta[row])
        if self.spec.goal is not None:
            if rows.achieved_goal is None or rows.base_reward is None:
                raise ValueError("goal-conditioned replay needs achieved_goal and base_reward in every row")
            self.achieved_goal.index_copy_(0, slots, rows.achieved_goal.to(dev, torch.float32))
            self.base_reward.index_copy_(0, slots, rows.base_reward.to(dev, torch.float32))

    def set_episode_len(self, slots: Tensor, length: Tensor) -> None:
        """Back-fill the length of finished episodes at `slots` [M]."""
        dev = self.device
        self.episode_len.index_copy_(0, slots.to(dev, non_blocking=True), length.to(dev, non_blocking=True))

    def set_stream_len(self, length: Tensor) -> None:
        """Steps written so far of each stream's running episode [S]."""
        self.stream_len.copy_(length, non_blocking=True)

    def lengths(self, index: Tensor) -> Tensor:
        """Known length of the episode of each slot in `index` [B] (finished or running)."""
        own = self.episode_len[index]  # [B]
        return torch.where(own >= 0, own, self.stream_len[self.stream[index]])  # [B]

    def window(self, index: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """The `width` states ending at obs[index] in its episode, oldest first, zeros before its start.

        Returns the window [B, W, F] and which of its steps are real states [B, W].
        """
        back = torch.arange(width - 1, -1, -1, device=self.device)  # [W] steps back: W-1 .. 0
        serial = self.serial[index, None] - back * self.stride[index, None]  # [B, W]
        slots = serial.remainder(self.capacity)  # [B, W]
        valid = (back <= self.episode_step[index, None]) & (self.serial[slots] == serial)  # [B, W]
        return self.obs[slots].float() * valid[..., None], valid  # [B, W, F], [B, W]

    def state_dict(self) -> dict[str, Tensor]:
        names = ("obs", "next_obs", "action", "reward", "done", *self.META, "stream_len")
        state = {name: getattr(self, name) for name in names}
        if self.spec.goal is not None:
            state |= {"achieved_goal": self.achieved_goal, "base_reward": self.base_reward}
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name, value in state.items():
            mine = getattr(self, name, None)
            if not isinstance(mine, Tensor) or mine.shape != value.shape:
                got = tuple(value.shape)
                want = None if mine is None else tuple(mine.shape)
                raise ValueError(f"replay storage checkpoint: {name} has shape {got}, expected {want}")
            mine.copy_(value)
