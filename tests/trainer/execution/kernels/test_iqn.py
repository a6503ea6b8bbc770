"""The one-kernel IQN target quantiles (`trainer.execution.kernels.iqn`) against `next_quantile_targets`, the
quantile head, gather and target it replaces. On the CPU through Triton's interpreter; on the GPU compiled by
Inductor inside the fused plan's step too (`tests/trainer/execution/plans/test_equivalence.py`)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from contracts.config import IQN_KERNEL_MAX_WIDTH, ConfigError, build_config
from tests.factories import tiny_config, tiny_state
from trainer.algo.model import ModelDims
from trainer.algo.step import Hyper, network_views, next_quantile_targets
from trainer.execution.kernels.iqn import iqn_target_quantiles, next_quantile_targets_fused, supports
from trainer.execution.plans.fused import FusedPlan
from trainer.execution.plans.graph import GraphPlan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GAMMA = 0.97
CORE = ["model.ensemble_heads=0", "model.iqn_embed=64", "model.hidden=256", "model.iqn_hidden=128"]
"""`core`'s IQN widths (the kernel's tiles: E 64, H in chunks of 64, h 128), with 3 branches x 5 actions: 15
outputs stored padded to 16."""


def _inputs(overrides: list[str], seed: int, branches: int = 3, actions: int = 4) -> tuple[dict, ModelDims, tuple]:
    """The target network's views (a view of a stacked [2, P] block, as the step has them), its dims, and the
    kernel's other inputs: ψ(s') (relu'd), target taus, a*, rewards and terminal and non-terminal rows."""
    config = tiny_config(["model.iqn_target_taus=5", *overrides])
    state = tiny_state(config, branches=branches, actions=actions)
    generator = torch.Generator().manual_seed(seed)
    stacked = torch.stack([state.online, state.target + 0.01 * torch.randn(state.target.shape, generator=generator)])
    views = {
        name: view[1] for name, view in network_views(state.main, stacked.to(DEVICE), Hyper.from_config(config)).items()
    }
    d = state.dims
    batch = 6
    h_next = torch.relu(torch.randn(2, 2 * batch, d.hidden, generator=generator))[1, batch:]  # [B, H], strided
    tau = torch.rand(batch, d.iqn_target_taus, generator=generator)
    a_star = torch.randint(0, d.actions, (batch, d.branches), generator=generator)
    reward = torch.tensor([0.3, -2.5, 2.5, 1.7, -0.4, 0.0])
    done = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    return views, d, tuple(t.to(DEVICE) for t in (h_next, tau, a_star, reward, done))


@pytest.mark.parametrize(
    ("overrides", "branches", "actions"),
    [([], 3, 4), (CORE, 3, 5), (["model.iqn_embed=5", "model.hidden=70", "model.iqn_hidden=20"], 2, 7)],
    ids=["tiny", "core-widths", "odd-widths"],
)
def test_the_kernel_is_the_quantile_head_gathered_at_a_star_and_discounted(
    overrides: list[str], branches: int, actions: int
) -> None:
    """float32, the products' sums in another order."""
    p, d, (h_next, tau, a_star, reward, done) = _inputs(
        overrides, seed=len(overrides), branches=branches, actions=actions
    )
    target = next_quantile_targets_fused(p, h_next, tau, a_star, reward, done, GAMMA, d)
    expected = next_quantile_targets(p, h_next, tau, a_star, reward, done, GAMMA, d)
    assert target.shape == (6, d.iqn_target_taus, d.branches) and target.dtype == torch.float32
    torch.testing.assert_close(target, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(target[3], reward[3].expand_as(target[3]))  # terminal: the reward alone
    discounted = next_quantile_targets_fused(p, h_next, tau, a_star, reward, done, 0.5, d)
    assert not torch.allclose(discounted[0], target[0]) and torch.equal(discounted[5], target[5])


def test_under_mixed_precision_each_layer_is_rounded_to_bf16_as_autocast_rounds_it() -> None:
    """h_s2 in bf16 (the trunk's output under autocast) sets the products' precision. The written form's products
    run under autocast; the kernel's take the same bf16 inputs and round each layer's output once. On the CPU the
    two agree bit for bit at `core`'s widths (without the roundings, 2/3 of the outputs differ, by up to 0.3%); on
    a GPU cuBLAS sums in another order, and a sum near a rounding boundary lands one bf16 step apart."""
    p, d, (h_next, tau, a_star, reward, done) = _inputs(CORE, seed=7, actions=5)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        target = next_quantile_targets_fused(p, h_next.bfloat16(), tau, a_star, reward, done, GAMMA, d)
        expected = next_quantile_targets(p, h_next.bfloat16(), tau, a_star, reward, done, GAMMA, d)
    tolerance = 2e-2 if DEVICE == "cuda" else 0.0
    torch.testing.assert_close(target, expected, rtol=tolerance, atol=tolerance)
    cast_once = {name: view.bfloat16() for name, view in p.items()}  # as the step passes them (`network_views`)
    same = next_quantile_targets_fused(cast_once, h_next.bfloat16(), tau, a_star, reward, done, GAMMA, d)
    assert torch.equal(same, target)  # bf16 weights are read as they are, fp32 ones rounded: the same values
    fp32 = next_quantile_targets(p, h_next, tau, a_star, reward, done, GAMMA, d)
    assert not torch.allclose(target, fp32, rtol=1e-4, atol=1e-4)  # the rounding happened: not float32's result


def test_a_non_finite_state_poisons_only_its_own_sample() -> None:
    p, d, (h_next, tau, a_star, reward, done) = _inputs([], seed=3)
    h_next = h_next.clone()
    h_next[2, 5] = float("nan")
    target = next_quantile_targets_fused(p, h_next, tau, a_star, reward, done, GAMMA, d)
    assert torch.isnan(target[2]).all() and torch.isfinite(target[[0, 1, 3, 4, 5]]).all()


def test_what_the_kernel_cannot_run_is_refused_here_and_by_the_config() -> None:
    assert supports(IQN_KERNEL_MAX_WIDTH, IQN_KERNEL_MAX_WIDTH, IQN_KERNEL_MAX_WIDTH)
    assert not supports(IQN_KERNEL_MAX_WIDTH + 1, 8, 8) and not supports(8, 8, IQN_KERNEL_MAX_WIDTH + 1)
    p, d, (h_next, tau, a_star, reward, done) = _inputs([], seed=4)
    weights = [p[name] for name in ("iqn_embed_w", "iqn_embed_b", "iqn1_w", "iqn1_b", "iqn2_w", "iqn2_b")]
    with pytest.raises(ValueError, match="K·A must be at most 256, got 8, 16 and 390"):
        iqn_target_quantiles(tau, h_next, weights, a_star, reward, done, GAMMA, 130)  # 3 branches x 130 actions
    with pytest.raises(ValueError, match="embed_w needs unit stride"):
        transposed = weights[0].t().contiguous().t()
        iqn_target_quantiles(tau, h_next, [transposed, *weights[1:]], a_star, reward, done, GAMMA, d.actions)
    with pytest.raises(
        ConfigError, match=r"run.iqn_target_kernel 'triton' takes widths of at most 256; model.iqn_hidden is 300"
    ):
        build_config({"model": {"iqn_hidden": 300}, "run": {"iqn_target_kernel": "triton"}})
    assert build_config({"model": {"iqn_hidden": 300}}).run.iqn_target_kernel == "auto"  # which then runs Inductor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_on_the_gpu_the_target_quantiles_are_the_kernel() -> None:
    p, d, inputs = _inputs(CORE, seed=5, actions=5)
    torch._dynamo.reset()

    def targets(p: dict, *inputs: torch.Tensor) -> torch.Tensor:
        return next_quantile_targets_fused(p, *inputs, GAMMA, d)

    compiled = torch.compile(targets, fullgraph=True, dynamic=False)
    target, sources = run_and_get_code(compiled, p, *inputs)
    assert any("foxhunt.iqn_target_quantiles" in source for source in sources)
    torch.testing.assert_close(target, next_quantile_targets(p, *inputs, GAMMA, d), rtol=1e-3, atol=1e-3)  # TF32


def test_the_fused_plans_run_the_kernel_when_asked_or_by_default_under_bf16_and_the_other_plans_never() -> None:
    """'auto' takes the kernel where it was measured faster (bf16) and where the widths fit; None: as written."""
    fused, graph = object.__new__(FusedPlan), object.__new__(GraphPlan)  # hyper() reads the config and the dims
    fused.state = graph.state = tiny_state(tiny_config(), branches=3, actions=5)
    asked, bf16 = tiny_config(["run.iqn_target_kernel=triton"]), tiny_config(["run.precision=bf16"])
    assert tiny_config().run.iqn_target_kernel == "auto"
    assert fused.hyper(asked).iqn_target is next_quantile_targets_fused
    assert fused.hyper(bf16).iqn_target is next_quantile_targets_fused
    assert fused.hyper(tiny_config()).iqn_target is None  # TF32: not measured
    assert fused.hyper(tiny_config(["run.precision=bf16", "run.iqn_target_kernel=inductor"])).iqn_target is None
    assert graph.hyper(asked).iqn_target is None
    assert FusedPlan.iqn_kernel_chosen(bf16, IQN_KERNEL_MAX_WIDTH)
    assert not FusedPlan.iqn_kernel_chosen(bf16, IQN_KERNEL_MAX_WIDTH + 1)  # the data's K·A
    assert not FusedPlan.iqn_kernel_chosen(tiny_config(["run.precision=bf16", "model.iqn_hidden=300"]), 15)
