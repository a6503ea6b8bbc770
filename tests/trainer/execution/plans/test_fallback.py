"""Choosing a GPU plan without a GPU falls back to eager, loudly, naming why (runs on CPU)."""

from __future__ import annotations

import pytest
import torch

from contracts.config import TrainConfig, build_config
from contracts.plans import PLANS
from tests.factories import SMALL_MODEL
from trainer.algo.model import ModelDims
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.state import TrainState
from trainer.algo.step import NO_TIMER
from trainer.execution.data.spec import EnvSpec
from trainer.execution.plans import PlanFallbackWarning, make_plan, plan_class, unavailable_reason
from trainer.execution.plans.eager import EagerPlan

SMALL = [
    *SMALL_MODEL,
    "run.batch_size=4",
    "replay.capacity=64",
]


def small_setup() -> tuple[TrainState, ReplayBuffer, TrainConfig]:
    config = build_config({}, SMALL)
    spec = EnvSpec(obs_dim=8, branches=2, actions=3)
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    state = TrainState.create(config, dims, torch.device("cpu"))
    replay = ReplayBuffer(config, spec, "cpu", torch.Generator().manual_seed(0))
    return state, replay, config


@pytest.mark.parametrize("name", ["graph", "dual", "fused", "zerocopy"])
def test_gpu_plan_on_cpu_falls_back_to_eager_with_reason(name: str) -> None:
    state, replay, config = small_setup()
    with pytest.warns(PlanFallbackWarning, match=rf"plan '{name}' needs a CUDA GPU and this run is on cpu"):
        plan = make_plan(name, state, replay, config, NO_TIMER, torch.Generator())
    assert isinstance(plan, EagerPlan)


@pytest.mark.parametrize("name", ["graph", "dual", "fused", "zerocopy"])
def test_every_gpu_plan_is_implemented(name: str) -> None:
    """On a CUDA device the only reason left would be a missing module: there is none."""
    assert unavailable_reason(name, torch.device("cuda")) is None


def test_gpu_plan_classes_refuse_a_cpu_state_directly() -> None:
    from trainer.execution.plans.graph import GraphPlan

    state, replay, config = small_setup()
    with pytest.raises(ValueError, match="plan 'graph' needs a CUDA device, got cpu"):
        GraphPlan(state, replay, config, NO_TIMER, torch.Generator())


@pytest.mark.parametrize("name", list(PLANS))
def test_every_registered_plan_names_a_class_that_runs_it(name: str) -> None:
    """contracts.plans.PLANS is the one list: each entry's class exists here and calls itself by that name."""
    assert plan_class(name).name == name  # type: ignore[attr-defined]
    cpu_reason = unavailable_reason(name, torch.device("cpu"))
    assert (cpu_reason is None) == (not PLANS[name].needs_cuda)  # type: ignore[index]
