"""Execution plans: how `trainer.algo.step.train_step` runs (eager, torch.compile, CUDA graph, two
streams, fused, zero-copy). Which plans exist, what each does and its class: `contracts.plans.PLANS`.

`make_plan` picks one; a plan this machine cannot run falls back to `eager` with a warning naming why.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

import torch

from contracts.config import TrainConfig
from contracts.plans import PLANS, plan_names
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.state import TrainState
from trainer.algo.step import SectionTimer
from trainer.execution.plans.base import Plan


class PlanFallbackWarning(RuntimeWarning):
    """The chosen plan cannot run here; eager runs instead."""


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why plan `name` cannot run on `device`, or None if it can."""
    if name not in PLANS:
        return f"unknown plan {name!r} (choose from {plan_names()})"
    if PLANS[name].needs_cuda and device.type != "cuda":  # type: ignore[index]
        return f"plan {name!r} needs a CUDA GPU and this run is on {device.type}"
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
    plan: Plan = plan_class(name)(state, replay, config, timer, generator)
    return plan


PlanClass = Callable[[TrainState, ReplayBuffer, TrainConfig, SectionTimer, torch.Generator], Plan]
"""Every plan class's constructor: state, replay, config, timer, generator."""


def plan_class(name: str) -> PlanClass:
    """The class that runs plan `name`, imported now (the graph plans pull in Inductor and Triton)."""
    module, cls = PLANS[name].implementation.split(":")  # type: ignore[index]
    found: PlanClass = getattr(importlib.import_module(module), cls)
    return found
