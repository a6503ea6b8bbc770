"""On a GPU: sampling, HER and priority updates run without host syncs and replay in a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from contracts.config import TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.spec import EnvSpec

from .conftest import episode_rows, stack_rows

pytestmark = pytest.mark.gpu


def filled(config: TrainConfig, spec: EnvSpec, search: str = "tree") -> ReplayBuffer:
    generator = torch.Generator("cuda").manual_seed(0)
    buffer = ReplayBuffer(config, spec, "cuda", generator, search=search)  # type: ignore[arg-type]
    for step in range(40):
        buffer.add(stack_rows([episode_rows(e, range(step % 9, step % 9 + 1), e, length=9) for e in (1, 2)]))
    return buffer


@pytest.mark.parametrize("search", ["tree", "cdf"])
def test_sample_and_update_do_not_sync(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec, search: str
) -> None:
    buffer = filled(make_config(capacity=64, num_envs=2, storage_dtype="bfloat16"), goal_spec, search)
    batch = buffer.empty_batch(32)
    step = torch.zeros((), dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            buffer.sample_into(batch, step)
            buffer.update_priorities(batch.index, batch.reward)
            step += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batch.obs.is_cuda and (batch.weight <= 1).all()


@pytest.mark.parametrize("search", ["tree", "cdf"])
def test_sample_into_replays_in_a_cuda_graph(
    make_config: Callable[..., TrainConfig], goal_spec: EnvSpec, search: str
) -> None:
    config = make_config(capacity=64, num_envs=2)
    graphed, eager = filled(config, goal_spec, search), filled(config, goal_spec, search)
    static = graphed.empty_batch(32)
    step = torch.zeros((), dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph
        graphed.sample_into(static, step)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(graphed.generator)
    with torch.cuda.graph(graph):
        graphed.sample_into(static, step)
        graphed.update_priorities(static.index, static.reward)
    for _ in range(3):
        eager.generator.set_state(graphed.generator.get_state())
        graph.replay()
        want = eager.sample(32, step)
        eager.update_priorities(want.index, want.reward)
        for name, value in vars(want).items():
            torch.testing.assert_close(getattr(static, name), value)
        torch.testing.assert_close(graphed.sampler.tree, eager.sampler.tree)
        step += 1
