"""Ring writer: decides where rows go and keeps the host-side episode bookkeeping.

The host knows every row it writes, so serials, episode steps and lengths are computed here (NumPy)
and shipped with the rows in one small int64 block; nothing is read back from the device.

- `add(rows)`: one row per parallel env (stream), every call the same N streams. Row n of a call
  continues stream n's episode, so consecutive rows of an episode are N serials apart (stride N).
  When a row is its episode's last (`last`), the writer back-fills that episode's length into
  every slot of it still in the ring; until then HER reads the stream's running length.
- `extend(rows)`: a block of whole episodes stored row after row (stride 1), e.g. an offline
  dataset. Episodes still running in `add` streams are closed first (their rows stay valid). A
  row starts a new episode at the block's start, after a `last` row, or where
  `episode_step` does not continue the previous row's. Only the last `capacity` rows are kept.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from trainer.data.spec import Transitions
from trainer.replay.sampler import Sampler
from trainer.replay.storage import TensorStorage


class Writer(Protocol):
    """Adds rows to a storage and tells the sampler which slots are new."""

    def add(self, rows: Transitions) -> Tensor: ...

    def extend(self, rows: Transitions) -> Tensor: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...


class RingWriter:
    """Writes into `storage` round-robin; `streams` parallel envs feed `add`."""

    def __init__(self, storage: TensorStorage, sampler: Sampler, streams: int) -> None:
        self.storage = storage
        self.sampler = sampler
        self.streams = streams
        self.capacity = storage.capacity
        self.written = 0  # rows written since the start (the next row's serial)
        self.stream_step = np.zeros(streams, dtype=np.int64)  # steps of each running episode so far
        self.stream_start = np.zeros(streams, dtype=np.int64)  # serial of each running episode's row 0

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    def _store(self, rows: Transitions, serial: np.ndarray, meta: np.ndarray) -> Tensor:
        # host-built slots: an asynchronous copy (a blocking one would wait for the device's queued work)
        slots = torch.from_numpy(serial % self.capacity).to(self.storage.device, non_blocking=True)
        self.storage.write(slots, rows, torch.from_numpy(meta))
        self.sampler.on_write(slots, len(self))
        return slots

    def add(self, rows: Transitions) -> Tensor:
        """Store one row per stream; returns the slots [N] written."""
        n = len(rows)
        if n != self.streams:
            raise ValueError(f"replay add expects one row per env ({self.streams}), got {n}")
        last = rows.last.cpu().numpy().astype(bool)
        serial = self.written + np.arange(n, dtype=np.int64)
        step = self.stream_step.copy()
        self.stream_start = np.where(step == 0, serial, self.stream_start)
        self.written += n
        meta = np.stack([serial, np.full(n, n), np.arange(n), step, np.full(n, -1)])
        slots = self._store(rows, serial, meta)
        # finished episodes: length step+1 into each of their slots still in the ring
        self._backfill(self.stream_start[last], step[last] + 1, n)
        self.stream_step = np.where(last, 0, step + 1)
        self.storage.set_stream_len(torch.from_numpy(self.stream_step))
        return slots

    def _backfill(self, start: np.ndarray, length: np.ndarray, stride: int) -> None:
        if start.size == 0:
            return
        offsets = [np.arange(k, dtype=np.int64) * stride for k in length]
        serial = np.repeat(start, length) + np.concatenate(offsets)
        lengths = np.repeat(length, length)
        keep = serial >= self.written - self.capacity
        slots = torch.from_numpy(serial[keep] % self.capacity)
        self.storage.set_episode_len(slots, torch.from_numpy(lengths[keep]))

    def _close_running(self) -> None:
        """Treat running `add` episodes as ended here: rows written in between break their stride."""
        running = self.stream_step > 0
        self._backfill(self.stream_start[running], self.stream_step[running], self.streams)
        self.stream_step = np.zeros(self.streams, dtype=np.int64)
        self.storage.set_stream_len(torch.from_numpy(self.stream_step))

    def extend(self, rows: Transitions) -> Tensor:
        """Store a block of whole episodes row after row; returns the slots written."""
        n = len(rows)
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.storage.device)
        self._close_running()
        last = rows.last.cpu().numpy().astype(bool)
        start = np.ones(n, dtype=bool)
        start[1:] = last[:-1]
        if rows.episode_step is not None:
            given = rows.episode_step.cpu().numpy().astype(np.int64)
            start[1:] |= given[1:] != given[:-1] + 1
        episode = np.cumsum(start) - 1  # [N] episode number within the block
        first = np.flatnonzero(start)
        step = np.arange(n, dtype=np.int64) - first[episode]
        length = np.diff(np.append(first, n))[episode]
        serial = self.written + np.arange(n, dtype=np.int64)
        self.written += n
        keep = slice(max(0, n - self.capacity), n)
        meta = np.stack([serial, np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64), step, length])
        kept = rows if keep.start == 0 else rows.select(torch.arange(keep.start, n))
        return self._store(kept, serial[keep], np.ascontiguousarray(meta[:, keep]))

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "written": torch.tensor(self.written, dtype=torch.int64),
            "stream_step": torch.from_numpy(self.stream_step.copy()),
            "stream_start": torch.from_numpy(self.stream_start.copy()),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["stream_step"].shape != (self.streams,):
            raise ValueError(
                f"replay writer checkpoint has {state['stream_step'].shape[0]} env streams, expected {self.streams}"
            )
        self.written = int(state["written"])
        self.stream_step = state["stream_step"].cpu().numpy().astype(np.int64)
        self.stream_start = state["stream_start"].cpu().numpy().astype(np.int64)
