"""Ring writers: wrap-around, episode bookkeeping for `add` and `extend`; the device writer against the host one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from trainer.algo.replay.sampler import PrioritizedSampler
from trainer.algo.replay.storage import TensorStorage
from trainer.algo.replay.writer import DeviceRingWriter, HostAdd, RingWriter, advance_many
from trainer.execution.data.spec import EnvSpec, Transitions

from .conftest import episode_rows, stack_rows


def build(spec: EnvSpec, capacity: int, streams: int = 1) -> tuple[TensorStorage, PrioritizedSampler, RingWriter]:
    storage = TensorStorage(spec, capacity, streams, "cpu")
    sampler = PrioritizedSampler(capacity, "cpu", alpha=1.0, beta_start=0.4, beta_end=1.0, total_steps=10)
    return storage, sampler, RingWriter(storage, sampler, streams)


def test_ring_wraps_around_and_overwrites_oldest(goal_spec: EnvSpec) -> None:
    storage, sampler, writer = build(goal_spec, 5)
    slots = [writer.add(episode_rows(1, range(s, s + 1))).tolist() for s in range(7)]
    assert slots == [[0], [1], [2], [3], [4], [0], [1]]
    assert len(writer) == 5 and int(sampler.size) == 5
    assert storage.obs[:, 2].tolist() == [5.0, 6.0, 2.0, 3.0, 4.0]  # steps 5, 6 replaced 0, 1
    assert storage.serial.tolist() == [5, 6, 2, 3, 4]
    assert (sampler.priorities() > 0).all()


def test_add_back_fills_episode_length_when_it_ends(goal_spec: EnvSpec) -> None:
    storage, _, writer = build(goal_spec, 32, streams=2)
    for step in range(4):  # env 0 ends its episode at step 2; env 1 runs on
        env0 = episode_rows(1, range(step, step + 1), length=3) if step < 3 else episode_rows(2, range(0, 1))
        writer.add(stack_rows([env0, episode_rows(9, range(step, step + 1))]))
    assert storage.episode_len[[0, 2, 4]].tolist() == [3, 3, 3]
    assert storage.episode_len[[1, 3, 5, 6, 7]].tolist() == [-1] * 5  # running
    assert storage.stream_len.tolist() == [1, 4]
    assert storage.lengths(torch.tensor([0, 6, 7])).tolist() == [3, 1, 4]
    assert storage.episode_step[:8].tolist() == [0, 0, 1, 1, 2, 2, 0, 3]
    assert storage.stride[:8].tolist() == [2] * 8


def test_extend_finds_episodes_from_done_and_episode_step(goal_spec: EnvSpec) -> None:
    storage, _, writer = build(goal_spec, 32)
    block = stack_rows(
        [
            episode_rows(1, range(3), length=3),  # ends with done
            episode_rows(2, range(4)),  # truncated: no done, the next row restarts at step 0
            episode_rows(3, range(5, 7)),  # starts mid-episode: the writer counts from 0
        ]
    )
    writer.extend(block)
    assert storage.episode_step[:9].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1]
    assert storage.episode_len[:9].tolist() == [3, 3, 3, 4, 4, 4, 4, 2, 2]
    assert storage.stride[:9].tolist() == [1] * 9


def test_extend_larger_than_capacity_keeps_the_newest_rows(goal_spec: EnvSpec) -> None:
    storage, _, writer = build(goal_spec, 4)
    slots = writer.extend(episode_rows(1, range(6), length=6))
    assert sorted(slots.tolist()) == [0, 1, 2, 3] and len(writer) == 4
    assert sorted(storage.obs[:, 2].tolist()) == [2.0, 3.0, 4.0, 5.0]
    assert storage.episode_len.tolist() == [6] * 4


def test_extend_closes_episodes_running_in_add_streams(goal_spec: EnvSpec) -> None:
    storage, _, writer = build(goal_spec, 16)
    writer.add(episode_rows(1, range(0, 1)))
    writer.add(episode_rows(1, range(1, 2)))
    writer.extend(episode_rows(2, range(2), length=2))
    assert storage.episode_len[:2].tolist() == [2, 2]
    writer.add(episode_rows(1, range(2, 3)))
    assert int(storage.episode_step[4]) == 0  # the add stream restarts its count


def test_add_rejects_wrong_row_count_and_state_round_trips(goal_spec: EnvSpec) -> None:
    _, _, writer = build(goal_spec, 8, streams=2)
    with pytest.raises(ValueError, match=r"one row per env \(2\), got 1"):
        writer.add(episode_rows(1, range(1)))
    writer.add(stack_rows([episode_rows(1, range(1)), episode_rows(2, range(1))]))
    _, _, other = build(goal_spec, 8, streams=2)
    other.load_state_dict(writer.state_dict())
    assert other.written == 2 and other.stream_step.tolist() == [1, 1]
    _, _, three = build(goal_spec, 8, streams=3)
    with pytest.raises(ValueError, match="2 env streams, expected 3"):
        three.load_state_dict(writer.state_dict())


def build_pair(
    spec: EnvSpec, capacity: int, streams: int
) -> tuple[
    tuple[TensorStorage, PrioritizedSampler, RingWriter], tuple[TensorStorage, PrioritizedSampler, DeviceRingWriter]
]:
    host = build(spec, capacity, streams)
    storage = TensorStorage(spec, capacity, streams, "cpu")
    sampler = PrioritizedSampler(capacity, "cpu", alpha=0.6, beta_start=0.4, beta_end=1.0, total_steps=10)
    host[1].alpha = 0.6
    return host, (storage, sampler, DeviceRingWriter(storage, sampler, streams))


def lockstep_rows(streams: int, step: int, length: int) -> Transitions:
    """One row per stream at `step` of episodes that all last `length` steps (as the torch market's)."""
    t = step % length
    return stack_rows(
        [episode_rows(100 * (step // length) + n, range(t, t + 1), stream=n, length=length) for n in range(streams)]
    )


def ragged_rows(streams: int, step: int) -> Transitions:
    """One row per stream, stream n's episodes lasting 2 + n steps (ends that do not line up)."""
    parts = []
    for n in range(streams):
        length = 2 + n
        t = step % length
        parts.append(episode_rows(100 * (step // length) + n, range(t, t + 1), stream=n, length=length))
    return stack_rows(parts)


def assert_same_replay(
    host: tuple[TensorStorage, PrioritizedSampler, RingWriter],
    device: tuple[TensorStorage, PrioritizedSampler, DeviceRingWriter],
) -> None:
    states = [
        (host[0].state_dict(), device[0].state_dict()),
        (host[1].state_dict(), device[1].state_dict()),
        (host[2].state_dict(), device[2].state_dict()),
    ]
    for left, right in states:
        assert left.keys() == right.keys()
        for name in left:
            assert left[name].dtype == right[name].dtype, name
            assert torch.equal(left[name], right[name]), name
    assert len(host[2]) == len(device[2]) and host[2].written == device[2].written


@pytest.mark.parametrize(
    ("capacity", "streams", "rows"),
    [
        (10, 3, "lockstep"),  # N does not divide C: a stream's oldest row in the ring may be cut off
        (12, 3, "lockstep"),  # N divides C
        (64, 3, "lockstep"),  # episodes entirely in the ring, no wrap
        (11, 3, "ragged"),  # partial ends: the mask travels to the device
        (4, 1, "ragged"),  # one stream: the back-fill block spans the whole ring (J = C)
    ],
)
def test_device_writer_stores_what_the_host_writer_stores(
    goal_spec: EnvSpec, capacity: int, streams: int, rows: str
) -> None:
    """Same rows, slots, bookkeeping, episode lengths and priorities, bit for bit, over several episode
    ends and wrap-arounds of the ring, with priority write-backs in between (so new rows take a moving
    maximum) and an `extend` in the middle (which closes running episodes)."""
    host, device = build_pair(goal_spec, capacity, streams)
    generator = torch.Generator().manual_seed(0)
    length = 5
    for step in range(40):
        block = lockstep_rows(streams, step, length) if rows == "lockstep" else ragged_rows(streams, step)
        assert torch.equal(host[2].add(block), device[2].add(block))
        assert_same_replay(host, device)
        if step % 3 == 2:
            index = torch.randint(0, len(host[2]), (4,), generator=generator)
            loss = torch.randn(4, generator=generator) * 3
            host[1].update(index, loss)
            device[1].update(index, loss)
        if step == 22:
            block = episode_rows(7, range(3), length=3)
            assert torch.equal(host[2].extend(block), device[2].extend(block))
            assert_same_replay(host, device)
    assert host[2].written == 40 * streams + 3


def test_device_writer_checkpoints_load_into_the_host_writer_and_back(goal_spec: EnvSpec) -> None:
    host, device = build_pair(goal_spec, 10, 2)
    for step in range(7):
        device[2].add(lockstep_rows(2, step, 4))
    host[0].load_state_dict(device[0].state_dict())
    host[1].load_state_dict(device[1].state_dict())
    host[2].load_state_dict(device[2].state_dict())
    other = build_pair(goal_spec, 10, 2)[1]
    other[2].load_state_dict(host[2].state_dict())
    assert other[2].written == 14 and other[2].stream_step.tolist() == [3, 3]
    for step in range(7, 12):
        block = lockstep_rows(2, step, 4)
        assert torch.equal(host[2].add(block), device[2].add(block))
    assert_same_replay(host, device)


def test_device_writer_refuses_what_it_cannot_store(goal_spec: EnvSpec) -> None:
    storage = TensorStorage(goal_spec, 2, 3, "cpu")
    sampler = PrioritizedSampler(2, "cpu", alpha=1.0, beta_start=0.4, beta_end=1.0, total_steps=10)
    with pytest.raises(ValueError, match="capacity >= streams, got 2 < 3"):
        DeviceRingWriter(storage, sampler, 3)
    writer = DeviceRingWriter(storage, sampler, 2)
    with pytest.raises(ValueError, match=r"one row per env \(2\), got 1"):
        writer.add(episode_rows(1, range(1)))
    assert writer.extend(episode_rows(1, range(0))).shape == (0,)
    with pytest.raises(ValueError, match="2 env streams, expected 3"):
        DeviceRingWriter(TensorStorage(goal_spec, 8, 3, "cpu"), sampler, 3).load_state_dict(writer.state_dict())


HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")


def test_device_writer_add_reads_nothing_from_the_device(goal_spec: EnvSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor method that brings a value to the host is spied on while the device writer adds rows
    across episode ends and a wrap-around; only the rows' host-side `last` mask is read."""
    storage = TensorStorage(goal_spec, 10, 3, "cpu")
    sampler = PrioritizedSampler(10, "cpu", alpha=0.6, beta_start=0.4, beta_end=1.0, total_steps=10)
    writer = DeviceRingWriter(storage, sampler, 3)
    blocks = [lockstep_rows(3, step, 4) for step in range(12)]
    host = {id(block.last) for block in blocks}
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *args: Any, _name: str = name, _original: Any = original) -> Any:
            if id(self) not in host:
                reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for block in blocks:
        writer.add(block)
    monkeypatch.undo()
    assert reads == []
    assert writer.written == 36 and storage.episode_len.tolist() == [4] * 10  # every episode in the ring ended


def test_many_writers_advanced_at_once_move_on_as_each_alone(goal_spec: EnvSpec) -> None:
    """`advance_many` (a pack's runs' bookkeeping in one pass) against the same writers advanced one by one: the
    same plans and the same state after every step, with each writer at its own count and episode ends."""
    rng = np.random.default_rng(0)
    apart = [build(goal_spec, 16, streams=3)[2] for _ in range(4)]
    together = [build(goal_spec, 16, streams=3)[2] for _ in range(4)]
    for i, (a, b) in enumerate(zip(apart, together, strict=True)):  # different counts: one writer wraps sooner
        a.written = b.written = 5 * i
    for _ in range(40):
        last = rng.random((4, 3)) < 0.3  # [R, N]
        alone = [writer.advance(row) for writer, row in zip(apart, last, strict=True)]
        for one, many in zip(alone, advance_many(together, last), strict=True):
            for field, value in zip(HostAdd._fields, one, strict=True):
                np.testing.assert_array_equal(getattr(many, field), value, err_msg=field)
        for a, b in zip(apart, together, strict=True):
            assert a.written == b.written
            np.testing.assert_array_equal(a.stream_step, b.stream_step)
            np.testing.assert_array_equal(a.stream_start, b.stream_start)
    assert any(len(plan.ended_start) for plan in alone)  # episodes did end, and were compared
