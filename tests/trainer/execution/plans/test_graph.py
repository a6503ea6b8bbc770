"""Host-side choices of the graph plans that need no GPU: when sampling can go inside the graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contracts.config import build_config
from tests.trainer.execution.plans.test_fallback import SMALL
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.market import market_goal_spec
from trainer.execution.data.spec import EnvSpec
from trainer.execution.plans.graph import GraphPlan


def replay_with_goal(capturable: bool | None) -> ReplayBuffer:
    config = build_config({}, [*SMALL, f"replay.her={capturable is not None}", "replay.her_ratio=0.5"])
    goal = None if capturable is None else dataclasses.replace(market_goal_spec(), capturable=capturable)
    return ReplayBuffer(config, EnvSpec(obs_dim=8, branches=2, actions=3, goal=goal), "cpu", torch.Generator())


@pytest.mark.parametrize("capturable", [None, True])
def test_sampling_goes_inside_the_graph_without_her_or_with_a_tensor_goal_reward(capturable: bool | None) -> None:
    assert GraphPlan.can_sample_in_graph(GraphPlan.__new__(GraphPlan), replay_with_goal(capturable))


def test_a_host_side_her_reward_samples_outside_the_graph_with_a_warning() -> None:
    replay = replay_with_goal(False)
    assert replay.her is not None
    with pytest.warns(RuntimeWarning, match="HER goal reward calls the host, so sampling runs outside the graph"):
        assert not GraphPlan.can_sample_in_graph(GraphPlan.__new__(GraphPlan), replay)
