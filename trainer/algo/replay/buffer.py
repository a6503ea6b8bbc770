"""The replay buffer: storage + prioritised sampler + ring writer (+ HER), composed.

`sample` / `sample_into` draw slots by priority, gather the rows, the attention window and (for
goal-conditioned data) relabel goals, all as device tensor ops; `update_priorities` writes per-sample
losses back by slot. Only `add`/`extend` run host code (the host produces the rows anyway), and with
`device_writer` only `extend` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from contracts.config import TrainConfig
from trainer.algo.batch import Batch
from trainer.algo.replay.her import HindsightRelabeler
from trainer.algo.replay.sampler import PrioritizedSampler
from trainer.algo.replay.storage import TensorStorage
from trainer.algo.replay.writer import DeviceRingWriter, RingWriter
from trainer.algo.rng import UNIFORM, rows_draw_
from trainer.execution.data.spec import EnvSpec, Transitions


class ReplayBuffer:
    """GPU-resident prioritised replay for one run (`config.replay`, window `config.model.attn_window`).

    `search` picks how the sampler finds slots ("tree" descent or "cdf" search; same draws).
    `device_writer` keeps the writer's bookkeeping on the device (`DeviceRingWriter`: the same rows,
    slots and priorities, no host read, capturable).
    """

    def __init__(
        self,
        config: TrainConfig,
        spec: EnvSpec,
        device: torch.device | str,
        generator: torch.Generator,
        *,
        search: Literal["tree", "cdf"] | None = None,
        device_writer: bool = False,
    ) -> None:
        replay = config.replay
        search = search or replay.search
        self.spec = spec
        self.device = torch.device(device)
        self.generator = generator
        self.window = config.model.attn_window
        self.storage = TensorStorage(spec, replay.capacity, config.data.num_envs, self.device, replay.storage_dtype)
        self.sampler = PrioritizedSampler(
            replay.capacity,
            self.device,
            alpha=replay.alpha,
            beta_start=replay.beta_start,
            beta_end=replay.beta_end,
            total_steps=config.run.steps,
            eps=replay.priority_eps,
            search=search,
        )
        self.writer: RingWriter | DeviceRingWriter
        if device_writer:
            self.writer = DeviceRingWriter(self.storage, self.sampler, config.data.num_envs)
        else:
            self.writer = RingWriter(self.storage, self.sampler, config.data.num_envs)
        self.her: HindsightRelabeler | None = None
        if replay.her and replay.her_ratio > 0 and spec.goal is not None:
            self.her = HindsightRelabeler(spec.goal, replay.her_ratio)

    def __len__(self) -> int:
        return len(self.writer)

    def add(self, rows: Transitions) -> Tensor:
        """One row per parallel env; returns the slots written."""
        return self.writer.add(rows)

    def extend(self, rows: Transitions) -> Tensor:
        """A block of whole episodes (offline data); returns the slots written."""
        return self.writer.extend(rows)

    def empty_batch(self, batch_size: int) -> Batch:
        """A static Batch of this buffer's shapes, for `sample_into`."""
        return Batch.empty(batch_size, self.spec.obs_dim, self.spec.branches, self.window, self.device)

    def sample(self, batch_size: int, step: int | Tensor) -> Batch:
        """A fresh Batch of `batch_size` prioritised samples at update `step` (for the beta schedule)."""
        return self.sample_into(self.empty_batch(batch_size), step)

    def sample_into(self, batch: Batch, step: int | Tensor) -> Batch:
        """Fill the static `batch` in place: no allocation visible to the caller, no host sync."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer: add transitions first")
        self.gather_into(batch, *self.draw(batch.size), step)
        return batch

    def draw(self, batch_size: int) -> tuple[Tensor, Tensor | None]:
        """The random numbers of one sample, from the replay's generator in this order: PER's points [B]
        and HER's [2, B] (None without HER)."""
        points = self.sampler.draw(batch_size, self.generator)
        her = None if self.her is None else self.her.draw(batch_size, self.device, self.generator)
        return points, her

    @staticmethod
    def draw_rows(replays: Sequence[ReplayBuffer], batch_size: int) -> tuple[Tensor, Tensor | None]:
        """`draw` of K replays, row i from replays[i]'s generator: the same numbers ([K, B] float64, as
        `PrioritizedSampler.draw`'s, and [K, 2, B], as `HindsightRelabeler.draw`'s), one launch each where the
        generators are keyed (`trainer.algo.rng`)."""
        generators, runs, device = [r.generator for r in replays], len(replays), replays[0].device
        points = rows_draw_(torch.empty(runs, batch_size, dtype=torch.float64, device=device), generators, UNIFORM)
        if replays[0].her is None:
            return points, None
        return points, rows_draw_(torch.empty(runs, 2, batch_size, device=device), generators, UNIFORM)

    def gather_into(self, batch: Batch, points: Tensor, her_draw: Tensor | None, step: int | Tensor) -> None:
        """Sampling without its random numbers (`draw`'s): the slots of PER's `points` [B], their weights,
        rows and attention windows into `batch`, then HER's relabelling. What a compiled plan compiles."""
        index, weight = self.sampler.locate(points, step)  # [B], [B]
        store = self.storage
        batch.index.copy_(index)
        batch.weight.copy_(weight)
        batch.obs.copy_(store.obs[index])
        batch.next_obs.copy_(store.next_obs[index])
        batch.action.copy_(store.action[index])
        batch.reward.copy_(store.reward[index])
        batch.done.copy_(store.done[index])
        window, valid = store.window(index, batch.window.shape[1])  # [B, W, F], [B, W]
        batch.window.copy_(window)
        if self.her is not None:
            assert her_draw is not None
            rows = batch.obs, batch.next_obs, batch.reward, batch.window
            self.her.relabel(store, index, *rows, valid, her_draw)

    def update_priorities(self, index: Tensor, loss: Tensor) -> None:
        """priority_i = (|loss_i| + eps)^alpha for the slots `index` [B] (on the device, no sync)."""
        self.sampler.update(index, loss)

    def _parts(self) -> dict[str, TensorStorage | PrioritizedSampler | RingWriter | DeviceRingWriter]:
        """The stateful parts, by checkpoint prefix."""
        return {"storage": self.storage, "sampler": self.sampler, "writer": self.writer}

    def state_dict(self) -> dict[str, Tensor]:
        """Every tensor of the buffer, flat with dotted prefixes (safetensors-ready)."""
        parts = self._parts()
        return {f"{name}.{key}": value for name, part in parts.items() for key, value in part.state_dict().items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name, part in self._parts().items():
            prefix = f"{name}."
            part.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
