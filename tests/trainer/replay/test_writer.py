"""Ring writer: wrap-around, episode bookkeeping for `add` and `extend`."""

from __future__ import annotations

import pytest
import torch

from trainer.data.spec import EnvSpec
from trainer.replay.sampler import PrioritizedSampler
from trainer.replay.storage import TensorStorage
from trainer.replay.writer import RingWriter

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
