"""Execution plans: how `trainer.algo.step.train_step` runs (eager, CUDA graph, two streams, fused, zero-copy).

`make_plan` picks one; a plan this machine cannot run falls back to `eager` with a warning naming why.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import torch

from contracts.config import PLANS, TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.state import TrainState
from trainer.algo.step import SectionTimer
from trainer.execution.plans.base import Plan

# plan name -> (module, class); a plan is available once its module exists.
_IMPLEMENTATIONS = {
    "eager": ("trainer.execution.plans.eager", "EagerPlan"),
    "graph": ("trainer.execution.plans.graph", "GraphPlan"),
    "dual": ("trainer.execution.plans.dual", "DualStreamPlan"),
    "fused": ("trainer.execution.plans.fused", "FusedPlan"),
    "zerocopy": ("trainer.execution.plans.zerocopy", "ZeroCopyPlan"),
}


class PlanFallbackWarning(RuntimeWarning):
    """The chosen plan cannot run here; eager runs instead."""


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why plan `name` cannot run on `device`, or None if it can."""
    if name not in PLANS:
        return f"unknown plan {name!r} (choose from {', '.join(PLANS)})"
    if name == "eager":
        return None
    if device.type != "cuda":
        return f"plan {name!r} needs a CUDA GPU and this run is on {device.type}"
    module, _ = _IMPLEMENTATIONS[name]
    if importlib.util.find_spec(module) is None:
        return f"plan {name!r} is not implemented in this build"
    return None


def resolve_plan(name: str, device: torch.device) -> str:
    """`name` if it can run on `device`, else "eager" with a `PlanFallbackWarning` naming why."""
    reason = unavailable_reason(name, device)
    if reason is not None:
        warnings.warn(f"{reason}: falling back to the eager plan", PlanFallbackWarning, stacklevel=3)
        return "eager"
    return name


def make_plan(
    name: str,
    state: TrainState,
    replay: ReplayBuffer,
    config: TrainConfig,
    timer: SectionTimer,
    generator: torch.Generator,
) -> Plan:
    """Plan `name` (or eager, see `resolve_plan`). Graph plans capture on real samples: build them
    once `replay` holds transitions (the training loop does, after its warm-up to learning_starts)."""
    name = resolve_plan(name, state.atoms.device)
    module, cls = _IMPLEMENTATIONS[name]
    plan_class = getattr(importlib.import_module(module), cls)
    plan: Plan = plan_class(state, replay, config, timer, generator)
    return plan
