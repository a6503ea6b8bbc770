"""Real training, whichever plan: two runs of the same seed advanced in lockstep, compared after every update.

A final-state comparison only says that two runs parted somewhere; this one names the first update at
which any stateful tensor (network, optimiser, replay storage and priorities, generators) differs, so a
failure points at the part that parted first. On the CPU the graph plans cannot run, so the CPU test
checks the harness itself on two eager runs (and that it does catch a divergence); the GPU tests
compare plan=graph (float32) with eager over 2,000 updates of CartPole, and print how far the TF32
plan drifts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from contracts.config import TrainConfig, load_config
from tests.factories import needs_gpu, tiny_config
from trainer.runtime.train import Run, build_run, collect, fill_replay, start_plan

CARTPOLE = Path(__file__).resolve().parents[3] / "examples" / "cartpole.yaml"


def stateful_tensors(run: Run) -> dict[str, torch.Tensor]:
    """Everything a run carries from one update to the next, by name."""
    tensors = {f"state.{name}": tensor for name, tensor in run.state.tensors().items()}
    tensors |= {f"replay.{name}": tensor for name, tensor in run.replay.state_dict().items()}
    tensors["generator"] = run.generator.get_state()
    tensors["explore_generator"] = run.explore_generator.get_state()
    return tensors


def differing(a: Run, b: Run) -> list[str]:
    left, right = stateful_tensors(a), stateful_tensors(b)
    return sorted(name for name in left if not torch.equal(left[name].cpu(), right[name].cpu()))


@dataclass
class Divergence:
    update: int
    """Updates both runs had made when they first differed (0: before the first update)."""
    names: list[str]


def advance(run: Run) -> None:
    """One call of the training loop's body: collect the rows of the plan's updates, then run them."""
    updates = run.plan.steps_per_call
    collect(run, run.act_fn(), updates)
    run.plan.run(run.step)
    run.timer.end_step()
    run.step += updates


def first_divergence(a: TrainConfig, b: TrainConfig, tmp_path: Path, updates: int) -> Divergence | None:
    """Run `a` and `b` side by side from the same seed; the first point at which their state differs."""
    runs = [build_run(config, tmp_path / name) for name, config in (("a", a), ("b", b))]
    for run in runs:
        fill_replay(run)
        start_plan(run)
    names = differing(*runs)
    if names:
        return Divergence(0, names)
    while runs[0].step < updates:
        for run in runs:
            advance(run)
        assert runs[0].step == runs[1].step, "the plans advance by different numbers of updates per call"
        names = differing(*runs)
        if names:
            return Divergence(runs[0].step, names)
    return None


def test_two_eager_runs_of_one_seed_never_part(tmp_path: Path) -> None:
    config = tiny_config(["run.steps=12"])
    assert first_divergence(config, config, tmp_path, 12) is None


def test_a_different_seed_is_caught_before_the_first_update(tmp_path: Path) -> None:
    divergence = first_divergence(tiny_config(), tiny_config(["run.seed=7"]), tmp_path, 12)
    assert divergence is not None and divergence.update == 0
    assert "state.online" in divergence.names and "generator" in divergence.names


def test_a_different_learning_rate_is_caught_at_the_first_update(tmp_path: Path) -> None:
    divergence = first_divergence(tiny_config(), tiny_config(["optim.lr=0.01"]), tmp_path, 12)
    assert divergence is not None and divergence.update == 1
    assert "state.online" in divergence.names


def cartpole_on_gpu(plan: str, steps: int) -> TrainConfig:
    return load_config(
        CARTPOLE,
        [
            "run.device=cuda",
            f"run.plan={plan}",
            f"run.steps={steps}",
            "run.eval_every=0",
            "run.stop_at_return=null",
            "run.eval_episodes=0",
        ],
    )


@pytest.mark.gpu
@needs_gpu
def test_a_real_graph_run_matches_eager_bit_for_bit_at_every_update(tmp_path: Path) -> None:
    """2,000 updates of real CartPole training (collection included), same seed: plan=graph (float32)
    holds eager's state exactly after every update."""
    divergence = first_divergence(cartpole_on_gpu("eager", 2000), cartpole_on_gpu("graph", 2000), tmp_path, 2000)
    assert divergence is None, f"graph parted from eager after {divergence.update} updates in {divergence.names}"


@pytest.mark.gpu
@needs_gpu
def test_the_tf32_plan_s_drift_from_eager_over_real_training(tmp_path: Path) -> None:
    """Printed, not bounded: TF32 rounding compounds through acting, so the trajectories part."""
    finals = {}
    for plan in ("eager", "fused"):
        run = build_run(cartpole_on_gpu(plan, 2000), tmp_path / plan)
        fill_replay(run)
        start_plan(run)
        while run.step < 2000:
            advance(run)
        finals[plan] = {name: tensor.double() for name, tensor in run.state.tensors().items()}
    eager, fused = finals["eager"], finals["fused"]
    drift = {name: float((fused[name] - want).norm() / want.norm().clamp(min=1e-12)) for name, want in eager.items()}
    print(f"fused (TF32) relative drift from eager after 2000 real updates: {json.dumps(drift)}")
    assert all(math.isfinite(value) for value in drift.values())
