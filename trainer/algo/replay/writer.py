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

`DeviceRingWriter` stores exactly what `RingWriter` stores (the same slots, rows, bookkeeping and
priorities: tests/trainer/algo/replay/test_writer.py runs both on one row sequence) with its `add`
bookkeeping on the storage's device, so that a block of adds reads nothing back and can be captured
in a CUDA graph (the torch market's collection, `trainer.execution.collect`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from trainer.algo.replay.sampler import PrioritizedSampler, Sampler
from trainer.algo.replay.storage import TensorStorage
from trainer.execution.data.spec import Transitions


class Writer(Protocol):
    """Adds rows to a storage and tells the sampler which slots are new."""

    def add(self, rows: Transitions) -> Tensor: ...

    def extend(self, rows: Transitions) -> Tensor: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...


class HostAdd(NamedTuple):
    """One `RingWriter.add` as the host decides it, before any device write."""

    serial: np.ndarray  # [N] the rows' serials (slot = serial mod C)
    meta: np.ndarray  # [5, N] their bookkeeping, in `TensorStorage.META` order
    ended_start: np.ndarray  # [E] first serial of each episode that ends with these rows
    ended_length: np.ndarray  # [E] its length, to back-fill (`backfill_host`)
    stream_step: np.ndarray  # [N] each stream's running episode length after the rows


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
        return _store_host(self.storage, self.sampler, rows, serial, meta, len(self))

    def add(self, rows: Transitions) -> Tensor:
        """Store one row per stream; returns the slots [N] written."""
        n = len(rows)
        if n != self.streams:
            raise ValueError(f"replay add expects one row per env ({self.streams}), got {n}")
        plan = self.advance(rows.last.cpu().numpy().astype(bool))
        slots = self._store(rows, plan.serial, plan.meta)
        self._backfill(plan.ended_start, plan.ended_length, n)
        self.storage.set_stream_len(torch.from_numpy(plan.stream_step))
        return slots

    def advance(self, last: np.ndarray) -> HostAdd:
        """The host half of `add` for rows whose episode-end mask is `last` [N]: the bookkeeping moves on, and
        what the rows' write needs is returned. (`advance_many` does it for many writers at once; for one, this
        takes half its time.)"""
        n = self.streams
        serial = self.written + np.arange(n, dtype=np.int64)
        step = self.stream_step.copy()
        self.stream_start = np.where(step == 0, serial, self.stream_start)
        self.written += n
        meta = np.stack([serial, np.full(n, n), np.arange(n), step, np.full(n, -1)])
        self.stream_step = np.where(last, 0, step + 1)
        # finished episodes: length step+1 into each of their slots still in the ring
        return HostAdd(serial, meta, self.stream_start[last], step[last] + 1, self.stream_step)

    def _backfill(self, start: np.ndarray, length: np.ndarray, stride: int) -> None:
        backfill_host(self.storage, start, length, stride, self.written)

    def _close_running(self) -> None:
        """Treat running `add` episodes as ended here: rows written in between break their stride."""
        running = self.stream_step > 0
        self._backfill(self.stream_start[running], self.stream_step[running], self.streams)
        self.stream_step = np.zeros(self.streams, dtype=np.int64)
        self.storage.set_stream_len(torch.from_numpy(self.stream_step))

    def extend(self, rows: Transitions) -> Tensor:
        """Store a block of whole episodes row after row; returns the slots written."""
        return _extend_host(self, rows)

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


class DeviceRingWriter:
    """`RingWriter` with the `add` bookkeeping on the storage's device: no host read, capturable.

    The write cursor (`written_t`), each stream's episode step and start are device tensors; a block
    of adds computes its slots, meta and back-fills there, so a CUDA graph that captured the adds
    replays them at the right slots. The host keeps only `written`, the count of rows (for `len` and
    `extend`): `add` advances it, and whoever replays a captured graph of adds calls `replayed` (the
    host code of `add` runs only while capturing).

    `rows.last` stays a host mask (the `Transitions` contract): no row last, no back-fill; every
    stream last (the torch market's envs end together), a back-fill with static shapes and constant
    masks; some streams last (Gymnasium envs), the mask is copied to the device (eager only).

    Back-fill of an episode that ends at the row of serial s_n (stream n, length L_n = step + 1): its
    rows are s_n - j * N for j < L_n, those still in the ring (serial >= written - C) get L_n. As a
    static [N, J] block, J = ceil(C / N) (no more rows of one stream fit in the ring, however long its
    episode); an entry past the episode's start, out of the ring or of a stream that does not end
    writes the value of that stream's newest row into it (duplicates of one value: a plain scatter is
    deterministic).

    `extend` (offline blocks, never captured) reads the stream bookkeeping back to close the running
    episodes, then stores as `RingWriter.extend` does.
    """

    def __init__(self, storage: TensorStorage, sampler: PrioritizedSampler, streams: int) -> None:
        if storage.capacity < streams:
            raise ValueError(f"device ring writer needs capacity >= streams, got {storage.capacity} < {streams}")
        self.storage = storage
        self.sampler = sampler
        self.streams = streams
        self.capacity = storage.capacity
        self.written = 0  # host count of rows written (equals written_t; never read from the device)
        i64: dict[str, Any] = {"dtype": torch.int64, "device": storage.device}
        self.written_t = torch.zeros((), **i64)  # the next row's serial
        self.stream_step = torch.zeros(streams, **i64)  # [N] steps of each running episode so far
        self.stream_start = torch.zeros(streams, **i64)  # [N] serial of each running episode's row 0
        self._stream = torch.arange(streams, **i64)  # [N]
        self._stride = torch.full((streams,), streams, **i64)  # [N]
        self._unknown = torch.full((streams,), -1, **i64)  # [N] episode_len while an episode runs
        self._every = torch.ones(streams, dtype=torch.bool, device=storage.device)  # [N]
        self.span = -(-self.capacity // streams)  # J = ceil(C / N): rows of one stream the ring can hold
        self._back = torch.arange(self.span, **i64)  # [J]

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    def replayed(self, adds: int) -> None:
        """Count the rows of `adds` adds a captured graph made on its replay (host mirror only)."""
        self.written += adds * self.streams

    def add(self, rows: Transitions) -> Tensor:
        """Store one row per stream; returns the slots [N] written (device tensors throughout)."""
        n = len(rows)
        if n != self.streams:
            raise ValueError(f"replay add expects one row per env ({self.streams}), got {n}")
        last = rows.last.cpu().numpy().astype(bool)
        serial = self.written_t + self._stream  # [N]
        step = self.stream_step.clone()  # [N]
        self.stream_start.copy_(torch.where(step == 0, serial, self.stream_start))
        self.written_t.add_(n)
        self.written += n
        slots = serial.remainder(self.capacity)  # [N]
        meta = torch.stack([serial, self._stride, self._stream, step, self._unknown])  # [5, N]
        self.storage.write(slots, rows, meta)
        # on_write takes the stored count as a host int (a constant once captured): the device's is set after it
        self.sampler.on_write(slots, len(self))
        torch.clamp(self.written_t, max=self.capacity, out=self.sampler.size)
        if last.any():
            ending = self._every if last.all() else torch.from_numpy(last).to(self.storage.device, non_blocking=True)
            self._backfill(serial, slots, step + 1, ending)
            self.stream_step.copy_(torch.where(ending, 0, step + 1))
        else:
            self.stream_step.add_(1)
        self.storage.set_stream_len(self.stream_step)
        return slots

    def _backfill(self, serial: Tensor, newest: Tensor, length: Tensor, ending: Tensor) -> None:
        """Length `length[n]` into every row still in the ring of the episodes ending at `serial[n]` [N]."""
        capacity = self.capacity
        back = serial[:, None] - self._back * self.streams  # [N, J] serials of the episode, newest first
        valid = ending[:, None] & (self._back < length[:, None]) & (back >= self.written_t - capacity)  # [N, J]
        own = torch.where(ending, length, self.storage.episode_len[newest])  # [N] the newest row's value
        slots = torch.where(valid, back.remainder(capacity), newest[:, None])  # [N, J]
        value = torch.where(valid, length[:, None], own[:, None])  # [N, J]
        self.storage.set_episode_len(slots.reshape(-1), value.reshape(-1))

    def _close_running(self) -> None:
        """`RingWriter._close_running` on the device's bookkeeping (read back: extend is never captured)."""
        step = self.stream_step.cpu().numpy()
        running = step > 0
        start = self.stream_start.cpu().numpy()
        backfill_host(self.storage, start[running], step[running], self.streams, self.written)
        self.stream_step.zero_()
        self.storage.set_stream_len(self.stream_step)

    def extend(self, rows: Transitions) -> Tensor:
        """Store a block of whole episodes row after row (as `RingWriter.extend`); returns the slots written."""
        self.written_t.add_(len(rows))
        return _extend_host(self, rows)

    def state_dict(self) -> dict[str, Tensor]:
        """The keys and values of `RingWriter.state_dict` (checkpoints load into either writer)."""
        return {"written": self.written_t, "stream_step": self.stream_step, "stream_start": self.stream_start}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["stream_step"].shape != (self.streams,):
            raise ValueError(
                f"replay writer checkpoint has {state['stream_step'].shape[0]} env streams, expected {self.streams}"
            )
        self.written = int(state["written"])
        self.written_t.fill_(self.written)
        self.stream_step.copy_(state["stream_step"])
        self.stream_start.copy_(state["stream_start"])


def _extend_host(writer: RingWriter | DeviceRingWriter, rows: Transitions) -> Tensor:
    """Both writers' `extend`, on the host's bookkeeping: close the running episodes, then the block."""
    if len(rows) == 0:
        return torch.zeros(0, dtype=torch.int64, device=writer.storage.device)
    writer._close_running()
    kept, serial, meta = _block(rows, writer.written, writer.capacity)
    writer.written += len(rows)
    return _store_host(writer.storage, writer.sampler, kept, serial, meta, len(writer))


def _store_host(
    storage: TensorStorage, sampler: Sampler, rows: Transitions, serial: np.ndarray, meta: np.ndarray, size: int
) -> Tensor:
    """Write `rows` at the host-built serials (slot = serial mod C) and announce them to the sampler."""
    # host-built slots: an asynchronous copy (a blocking one would wait for the device's queued work)
    slots = torch.from_numpy(serial % storage.capacity).to(storage.device, non_blocking=True)
    storage.write(slots, rows, torch.from_numpy(meta))
    sampler.on_write(slots, size)
    return slots


def advance_many(writers: Sequence[RingWriter], last: np.ndarray) -> list[HostAdd]:
    """`RingWriter.advance` of R writers of N streams each at once (`last` [R, N], each writer's episode-end mask):
    one pass of NumPy over all their bookkeeping, where a pack's K runs made K passes of a dozen small calls each
    (16 runs: about 0.1 ms against 0.3 ms on a CPU core). The same plans and state as `advance` of each writer
    (tests/trainer/algo/replay/test_writer.py)."""
    n = writers[0].streams
    serial = np.array([[w.written] for w in writers], dtype=np.int64) + np.arange(n, dtype=np.int64)  # [R, N]
    step = np.stack([w.stream_step for w in writers])  # [R, N] each stream's running length before these rows
    start = np.where(step == 0, serial, np.stack([w.stream_start for w in writers]))  # [R, N]
    after = np.where(last, 0, step + 1)  # [R, N]
    column = np.broadcast_to(np.arange(n, dtype=np.int64), serial.shape)
    meta = np.stack([serial, np.full_like(serial, n), column, step, np.full_like(serial, -1)], axis=1)  # [R, 5, N]
    plans = []
    for r, writer in enumerate(writers):
        writer.written += n
        writer.stream_start, writer.stream_step = start[r], after[r]
        # finished episodes: length step+1 into each of their slots still in the ring
        plans.append(HostAdd(serial[r], meta[r], start[r][last[r]], step[r][last[r]] + 1, after[r]))
    return plans


def backfill_host(storage: TensorStorage, start: np.ndarray, length: np.ndarray, stride: int, written: int) -> None:
    """Length `length[e]` into the rows start[e] + k * stride, k < length[e], still in the ring."""
    if start.size == 0:
        return
    offsets = [np.arange(k, dtype=np.int64) * stride for k in length]
    serial = np.repeat(start, length) + np.concatenate(offsets)
    lengths = np.repeat(length, length)
    keep = serial >= written - storage.capacity
    slots = torch.from_numpy(serial[keep] % storage.capacity)
    storage.set_episode_len(slots, torch.from_numpy(lengths[keep]))


def _block(rows: Transitions, written: int, capacity: int) -> tuple[Transitions, np.ndarray, np.ndarray]:
    """`extend`'s block of whole episodes: the rows kept (the last `capacity`), their serials and meta."""
    n = len(rows)
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
    serial = written + np.arange(n, dtype=np.int64)
    keep = slice(max(0, n - capacity), n)
    meta = np.stack([serial, np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64), step, length])
    kept = rows if keep.start == 0 else rows.select(torch.arange(keep.start, n))
    return kept, serial[keep], np.ascontiguousarray(meta[:, keep])
