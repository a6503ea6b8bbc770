"""The composed buffer: batches, priority write-back, checkpoints."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from contracts.config import TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.spec import EnvSpec

from .conftest import episode_rows


def test_sample_gives_the_architecture_batch_layout(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec
) -> None:
    buffer = ReplayBuffer(make_config(window=3), goal_spec, "cpu", torch.Generator().manual_seed(0))
    buffer.extend(episode_rows(1, range(10), length=10))
    batch = buffer.sample(8, 0)
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in vars(batch).items()}
    assert shapes == {
        "obs": ((8, 4), torch.float32),
        "action": ((8, 2), torch.int64),
        "reward": ((8,), torch.float32),
        "next_obs": ((8, 4), torch.float32),
        "done": ((8,), torch.float32),
        "window": ((8, 3, 4), torch.float32),
        "weight": ((8,), torch.float32),
        "index": ((8,), torch.int64),
    }
    step = batch.obs[:, 2].long()
    assert torch.equal(batch.index, step)  # extend wrote step s into slot s
    assert torch.equal(batch.action[:, 0], step % 3)
    assert torch.equal(batch.done, (step == 9).float())


def test_sampling_an_empty_buffer_is_an_error(make_config: Callable[..., TrainConfig], goal_spec: EnvSpec) -> None:
    buffer = ReplayBuffer(make_config(), goal_spec, "cpu", torch.Generator())
    with pytest.raises(ValueError, match="empty replay buffer"):
        buffer.sample(4, 0)


def test_sample_into_fills_static_buffers_in_place(make_config: Callable[..., TrainConfig], goal_spec: EnvSpec) -> None:
    buffer = ReplayBuffer(make_config(her=False), goal_spec, "cpu", torch.Generator().manual_seed(0))
    buffer.extend(episode_rows(1, range(10), length=10))
    static = buffer.empty_batch(16)
    pointers = {name: t.data_ptr() for name, t in vars(static).items()}
    buffer.sample_into(static, 3)
    assert {name: t.data_ptr() for name, t in vars(static).items()} == pointers
    assert (static.obs[:, 1] == 1.0).all()


def test_update_priorities_steers_sampling(make_config: Callable[..., TrainConfig], goal_spec: EnvSpec) -> None:
    buffer = ReplayBuffer(make_config(alpha=1.0, her=False), goal_spec, "cpu", torch.Generator().manual_seed(0))
    buffer.extend(episode_rows(1, range(10), length=10))
    buffer.update_priorities(torch.arange(10), torch.tensor([1.0] * 9 + [-27.0]))
    batch = buffer.sample(300, 0)
    assert abs(float((batch.index == 9).float().mean()) - 0.75) < 0.05  # 27 / (27 + 9)
    assert (batch.weight[batch.index != 9] == 1.0).all()  # rare -> the largest weight
    assert float(batch.weight[batch.index == 9].max()) < 0.5  # frequent -> small weight


def test_state_dict_round_trip_gives_identical_samples(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec
) -> None:
    config = make_config(capacity=32, num_envs=1, storage_dtype="bfloat16")
    buffer = ReplayBuffer(config, goal_spec, "cpu", torch.Generator().manual_seed(0))
    for step in range(40):  # wraps the ring
        buffer.add(episode_rows(step // 7, range(step % 7, step % 7 + 1), length=7))
    buffer.update_priorities(torch.arange(32), torch.linspace(0, 3, 32))
    state = {name: value.clone() for name, value in buffer.state_dict().items()}
    gen_state = buffer.generator.get_state()
    expected = [buffer.sample(16, 10) for _ in range(3)]

    restored = ReplayBuffer(config, goal_spec, "cpu", torch.Generator())
    restored.load_state_dict(state)
    restored.generator.set_state(gen_state)
    assert len(restored) == 32
    for want in expected:
        got = restored.sample(16, 10)
        for name, value in vars(want).items():
            torch.testing.assert_close(getattr(got, name), value)
    # both continue identically after more writes
    buffer.add(episode_rows(9, range(1)))
    restored.add(episode_rows(9, range(1)))
    torch.testing.assert_close(buffer.sample(16, 20).obs, restored.sample(16, 20).obs)
