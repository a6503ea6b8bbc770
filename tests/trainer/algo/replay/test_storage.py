"""Storage: the attention window gather, bf16 states, checkpoint shape checks."""

from __future__ import annotations

import pytest
import torch

from trainer.algo.replay.sampler import PrioritizedSampler
from trainer.algo.replay.storage import TensorStorage
from trainer.algo.replay.writer import RingWriter
from trainer.execution.data.spec import EnvSpec

from .conftest import episode_rows, stack_rows


def build(spec: EnvSpec, capacity: int, streams: int = 1, dtype: str = "float32") -> tuple[TensorStorage, RingWriter]:
    storage = TensorStorage(spec, capacity, streams, "cpu", dtype)
    sampler = PrioritizedSampler(capacity, "cpu", alpha=0.6, beta_start=0.4, beta_end=1.0, total_steps=10)
    return storage, RingWriter(storage, sampler, streams)


def test_window_is_oldest_first_with_zeros_before_episode_start(goal_spec: EnvSpec) -> None:
    storage, writer = build(goal_spec, 64)
    writer.extend(stack_rows([episode_rows(1, range(5), length=5), episode_rows(2, range(6), length=6)]))
    slot_of = {(1, s): s for s in range(5)} | {(2, s): 5 + s for s in range(6)}
    window, valid = storage.window(torch.tensor([slot_of[(2, 1)], slot_of[(2, 5)], slot_of[(1, 0)]]), 4)
    assert window.shape == (3, 4, 4)
    # episode 2, step 1: two zero rows (before the start), then steps 0 and 1 of episode 2
    assert window[0, :2].abs().sum() == 0 and valid[0].tolist() == [False, False, True, True]
    assert window[0, 2:, 1].tolist() == [2.0, 2.0] and window[0, 2:, 2].tolist() == [0.0, 1.0]
    # episode 2, step 5: steps 2..5 in order
    assert window[1, :, 2].tolist() == [2.0, 3.0, 4.0, 5.0] and valid[1].all()
    # first step of episode 1: only itself
    assert valid[2].tolist() == [False, False, False, True]
    torch.testing.assert_close(window[:, -1], storage.obs[torch.tensor([6, 10, 0])])


def test_window_follows_env_streams_and_drops_overwritten_rows(goal_spec: EnvSpec) -> None:
    storage, writer = build(goal_spec, 8, streams=2)
    for step in range(6):  # two envs, interleaved: stream n's rows are 2 slots apart
        writer.add(stack_rows([episode_rows(10, range(step, step + 1)), episode_rows(20, range(step, step + 1))]))
    # 12 rows into 8 slots: serials 4..11 remain, i.e. steps 2..5 of both episodes
    newest_env1 = 11 % 8
    window, valid = storage.window(torch.tensor([newest_env1]), 6)
    assert window[0, :, 1].tolist() == [0.0, 0.0, 20.0, 20.0, 20.0, 20.0]
    assert window[0, 2:, 2].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert valid[0].tolist() == [False, False, True, True, True, True]  # steps 0, 1 were overwritten


def test_bfloat16_storage_returns_float32_rounded_states(goal_spec: EnvSpec) -> None:
    storage, writer = build(goal_spec, 16, dtype="bfloat16")
    rows = episode_rows(1, range(3))
    rows.obs[:, 3] = 1.0 + 2**-12  # not representable in bf16
    writer.extend(rows)
    assert storage.obs.dtype == torch.bfloat16
    window, _ = storage.window(torch.tensor([2]), 2)
    assert window.dtype == torch.float32 and float(window[0, -1, 3]) == 1.0


def test_bad_dtype_and_checkpoint_shapes_raise(goal_spec: EnvSpec) -> None:
    with pytest.raises(ValueError, match="storage_dtype must be one of"):
        TensorStorage(goal_spec, 8, 1, "cpu", "float16")
    storage, _ = build(goal_spec, 8)
    other, _ = build(goal_spec, 16)
    with pytest.raises(ValueError, match=r"obs has shape \(16, 4\), expected \(8, 4\)"):
        storage.load_state_dict(other.state_dict())
