"""The one-kernel C51 target (`trainer.execution.kernels.c51`) against `target_distribution`, the gather,
softmax and projection it replaces. On the CPU through Triton's interpreter; on the GPU compiled by Inductor
inside the fused plan's step too (`tests/trainer/execution/plans/test_equivalence.py`)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from contracts.config import C51_KERNEL_MAX_ATOMS, ConfigError, build_config
from tests.factories import tiny_config, tiny_state
from trainer.algo.losses.c51 import target_distribution
from trainer.execution.kernels.c51 import c51_target, supports
from trainer.execution.plans.fused import FusedPlan
from trainer.execution.plans.graph import GraphPlan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, BRANCHES, ACTIONS = 6, 3, 5
GAMMA = 0.97


def _inputs(atoms: int, seed: int) -> tuple[torch.Tensor, ...]:
    """next_logits as the step has them (the s' half of a [2, 2B, K, A, N] block: offset and strided), a*,
    rewards past both ends of the support (so the clamps act), terminal and non-terminal transitions."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.randn(2, 2 * BATCH, BRANCHES, ACTIONS, atoms, generator=generator) * 3.0
    a_star = torch.randint(0, ACTIONS, (BATCH, BRANCHES), generator=generator)
    reward = torch.tensor([0.3, -25.0, 25.0, 1.7, -0.4, 0.0])
    done = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    support = torch.linspace(-10.0, 10.0, atoms)
    return tuple(t.to(DEVICE) for t in (block[1, BATCH:], a_star, reward, done, support))


@pytest.mark.parametrize("atoms", [51, 2, 64], ids=["core", "two-atoms", "a-power-of-two"])
def test_the_kernel_is_the_projection_of_the_softmax_at_a_star(atoms: int) -> None:
    """float32 with the sums in another order (one ulp of b_j near the clamps: the GPU contracts r + γz into
    one FMA); every row is a distribution."""
    next_logits, a_star, reward, done, support = _inputs(atoms, seed=atoms)
    target = c51_target(next_logits, a_star, reward, done, GAMMA, support)
    expected = target_distribution(next_logits, a_star, reward, done, GAMMA, support)
    assert target.shape == (BATCH, BRANCHES, atoms) and target.dtype == torch.float32
    torch.testing.assert_close(target, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(target.sum(-1), torch.ones(BATCH, BRANCHES, device=DEVICE))
    discounted = c51_target(next_logits, a_star, reward, done, 0.5, support)  # γ reaches the non-terminal rows
    assert not torch.allclose(discounted[0], target[0]) and torch.equal(discounted[3], target[3])


def test_a_non_finite_sample_poisons_only_its_own_target() -> None:
    next_logits, a_star, reward, done, support = _inputs(51, seed=3)
    next_logits[2, 1, a_star[2, 1], 7] = float("nan")
    target = c51_target(next_logits, a_star, reward, done, GAMMA, support)
    assert torch.isnan(target[2, 1]).all()
    finite = torch.ones(BATCH, BRANCHES, dtype=torch.bool, device=DEVICE)
    finite[2, 1] = False
    expected = target_distribution(next_logits, a_star, reward, done, GAMMA, support)
    torch.testing.assert_close(target[finite], expected[finite], rtol=1e-5, atol=1e-5)


def test_what_the_kernel_cannot_run_is_refused_here_and_by_the_config() -> None:
    assert supports(C51_KERNEL_MAX_ATOMS) and not supports(C51_KERNEL_MAX_ATOMS + 1) and not supports(1)
    next_logits, a_star, reward, done, support = _inputs(51, seed=4)
    with pytest.raises(ValueError, match="unit stride over the atoms"):
        c51_target(next_logits.transpose(2, 3).contiguous().transpose(2, 3), a_star, reward, done, GAMMA, support)
    wide = torch.zeros(BATCH, BRANCHES, ACTIONS, C51_KERNEL_MAX_ATOMS + 1, device=DEVICE)
    with pytest.raises(ValueError, match=f"at most {C51_KERNEL_MAX_ATOMS} atoms"):
        c51_target(wide, a_star, reward, done, GAMMA, torch.zeros(C51_KERNEL_MAX_ATOMS + 1, device=DEVICE))
    with pytest.raises(ConfigError, match=f"run.c51_target_kernel 'triton' takes at most {C51_KERNEL_MAX_ATOMS}"):
        build_config({"model": {"atoms": 129}, "run": {"c51_target_kernel": "triton"}})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_on_the_gpu_the_target_is_the_kernel() -> None:
    next_logits, a_star, reward, done, support = _inputs(51, seed=5)
    torch._dynamo.reset()
    compiled = torch.compile(c51_target, fullgraph=True, dynamic=False)
    target, sources = run_and_get_code(compiled, next_logits, a_star, reward, done, GAMMA, support)
    assert any("foxhunt.c51_target" in source for source in sources)
    expected = target_distribution(next_logits, a_star, reward, done, GAMMA, support)
    torch.testing.assert_close(target, expected, rtol=1e-5, atol=1e-5)


def test_the_fused_plans_run_the_kernel_by_default_where_the_atoms_fit_and_the_other_plans_never() -> None:
    fused, graph = object.__new__(FusedPlan), object.__new__(GraphPlan)  # hyper() reads the config and the dims
    fused.state = graph.state = tiny_state(tiny_config())
    asked, default = tiny_config(["run.c51_target_kernel=triton"]), tiny_config()
    assert default.run.c51_target_kernel == "auto"
    assert fused.hyper(asked).c51_target is c51_target and fused.hyper(default).c51_target is c51_target
    too_wide = tiny_config([f"model.atoms={C51_KERNEL_MAX_ATOMS + 1}"])  # auto: Inductor's form, not a refusal
    assert fused.hyper(too_wide).c51_target is target_distribution
    assert fused.hyper(tiny_config(["run.c51_target_kernel=inductor"])).c51_target is target_distribution
    assert graph.hyper(asked).c51_target is target_distribution
    assert graph.hyper(default).c51_target is target_distribution


@pytest.mark.parametrize("support_per_run", [False, True], ids=["shared-support", "support-per-run"])
def test_under_vmap_the_runs_samples_are_one_launch_equal_to_each_runs_own(support_per_run: bool) -> None:
    """A pack's runs (`_over_runs`): K runs' targets, bit for bit the kernel's target of each run alone."""
    runs = [_inputs(51, seed=10 + i) for i in range(3)]
    next_logits, a_star, reward, done = (torch.stack([run[j] for run in runs]) for j in range(4))
    support = runs[0][4]
    supports = support.expand(3, -1) if support_per_run else support
    vmapped = torch.func.vmap(c51_target, in_dims=(0, 0, 0, 0, None, 0 if support_per_run else None))
    target = vmapped(next_logits, a_star, reward, done, GAMMA, supports)
    assert target.shape == (3, BATCH, BRANCHES, 51)
    for i, (logits, actions, rewards, dones, _) in enumerate(runs):
        assert torch.equal(target[i], c51_target(logits, actions, rewards, dones, GAMMA, support)), i
