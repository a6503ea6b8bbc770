"""The IQN head's kernels (`trainer.execution.kernels.iqn`): the one-kernel target quantiles against
`next_quantile_targets`, the quantile head, gather and target it replaces; the online pass's forward and backward
kernels against autograd of the written head. On the CPU through Triton's interpreter; on the GPU compiled by
Inductor inside the fused plan's step too (`tests/trainer/execution/plans/test_equivalence.py`)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from contracts.config import IQN_KERNEL_MAX_WIDTH, ConfigError, build_config
from tests.factories import compiled_without_the_interpreter, tiny_config, tiny_state
from trainer.algo.model import ModelDims, iqn_quantiles
from trainer.algo.step import Hyper, network_views, next_quantile_targets, quantiles_at
from trainer.execution.kernels.iqn import (
    iqn_target_quantiles,
    next_quantile_targets_fused,
    quantiles_at_fused,
    supports,
)
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
    p, d, inputs = _inputs([], seed=4)
    h_next, tau, a_star, reward, done = (t[None] for t in inputs)  # one run
    weights = [p[name][None] for name in ("iqn_embed_w", "iqn_embed_b", "iqn1_w", "iqn1_b", "iqn2_w", "iqn2_b")]
    with pytest.raises(ValueError, match="K·A must be at most 256, got 8, 16 and 390"):
        iqn_target_quantiles(tau, h_next, weights, a_star, reward, done, GAMMA, 130)  # 3 branches x 130 actions
    with pytest.raises(ValueError, match="embed_w needs unit stride"):
        transposed = weights[0].transpose(1, 2).contiguous().transpose(1, 2)
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


# ---- the online pass: Z_τ(s, a) at the batch's actions and its gradient (`quantiles_at_fused`) ----


def _online_pass(fn: Any, p: dict, h: torch.Tensor, tau: torch.Tensor, action: torch.Tensor, d: ModelDims) -> tuple:
    """Z [B, T, K], and the gradients of Σ g ⊙ Z (g fixed, random) with respect to h and each of the head's layers,
    through `fn(p, h, tau, action, d)` under autocast when h is bf16 (the step's `mixed_precision`)."""
    leaves = {name: view.detach().clone().requires_grad_() for name, view in p.items()}
    h = h.detach().clone().requires_grad_()
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=h.dtype == torch.bfloat16):
        z = fn(leaves, h, tau, action, d)
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(11)).to(z.device)
    (g * z).sum().backward()
    return z, h.grad, {name: leaf.grad for name, leaf in leaves.items() if leaf.grad is not None}


def _written(p: dict, h: torch.Tensor, tau: torch.Tensor, action: torch.Tensor, d: ModelDims) -> torch.Tensor:
    return quantiles_at(iqn_quantiles(p, h, tau, d), action)


@pytest.mark.parametrize(
    ("overrides", "branches", "actions"),
    [([], 3, 4), (CORE, 3, 5), (["model.iqn_embed=5", "model.hidden=70", "model.iqn_hidden=20"], 2, 7)],
    ids=["tiny", "core-widths", "odd-widths"],
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_online_kernels_are_the_quantile_head_at_the_actions_and_its_gradient(
    overrides: list[str], branches: int, actions: int, precision: str
) -> None:
    """Forward and backward against autograd of the written form. float32: within 1e-5. bf16 (weights cast once,
    as the step has them): each layer's output and gradient rounded as autograd's bf16 products round them, so on
    the CPU bit for bit; on a GPU cuBLAS sums in another order."""
    p, d, (h, tau, action, _, _) = _inputs(overrides, seed=len(overrides) + 20, branches=branches, actions=actions)
    if precision == "bf16":
        p, h = {name: view.bfloat16() for name, view in p.items()}, h.bfloat16()
    z, grad_h, grads = _online_pass(quantiles_at_fused, p, h, tau, action, d)
    want_z, want_h, want = _online_pass(_written, p, h, tau, action, d)
    tolerance = 1e-5 if precision == "fp32" else (2e-2 if DEVICE == "cuda" else 0.0)
    assert z.shape == (6, tau.shape[1], d.branches) and grad_h.dtype == h.dtype
    torch.testing.assert_close(z, want_z, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(grad_h, want_h, rtol=tolerance, atol=tolerance)
    assert (
        grads.keys()
        == want.keys()
        == {"iqn_embed_w", "iqn_embed_b", "iqn1_w", "iqn1_b", "iqn2_w_padded", "iqn2_b_padded"}
    )
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want[name], rtol=tolerance, atol=tolerance, msg=name)
    assert not torch.equal(grads["iqn1_w"], torch.zeros_like(grads["iqn1_w"]))


def test_the_online_kernels_train_under_torch_func_as_the_step_takes_their_gradient() -> None:
    """`iqn_loss_of_features` differentiates with torch.func.grad over the flat parameters and h_s2: the kernels'
    autograd.Function carries it."""
    p, d, (h, tau, action, _, _) = _inputs(CORE, seed=30, actions=5)
    names = list(p)
    flat = torch.cat([p[name].reshape(-1) for name in names])
    sizes = [p[name].numel() for name in names]

    def loss(fn: Any, flat: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        views = {name: part.view(p[name].shape) for name, part in zip(names, flat.split(sizes), strict=True)}
        return fn(views, h, tau, action, d).square().mean()

    got = torch.func.grad(functools.partial(loss, quantiles_at_fused), argnums=(0, 1))(flat, h)
    want = torch.func.grad(functools.partial(loss, _written), argnums=(0, 1))(flat, h)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_the_fused_plans_run_the_online_kernels_only_when_asked() -> None:
    fused, graph = object.__new__(FusedPlan), object.__new__(GraphPlan)
    fused.state = graph.state = tiny_state(tiny_config(), branches=3, actions=5)
    asked = tiny_config(["run.iqn_online_kernel=triton"])
    assert tiny_config().run.iqn_online_kernel == "inductor"
    assert fused.hyper(asked).iqn_online is quantiles_at_fused
    assert fused.hyper(tiny_config(["run.precision=bf16"])).iqn_online is None  # not measured: as written
    assert graph.hyper(asked).iqn_online is None
    with pytest.raises(ConfigError, match=r"run.iqn_online_kernel 'triton' takes widths of at most 256"):
        build_config({"model": {"iqn_embed": 300}, "run": {"iqn_online_kernel": "triton"}})


@pytest.mark.parametrize("programs", [1, 2, 8])
@pytest.mark.parametrize("taus", [5, 8], ids=["samples-split", "whole-samples"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_online_gradients_add_up_across_programs(
    monkeypatch: pytest.MonkeyPatch, precision: str, taus: int, programs: int
) -> None:
    """Blocks of 16 rows. With 5 taus the 30 (sample, tau) rows are two blocks and sample 3's taus (rows 15 to 19)
    are split between them: its ∂h is the sum of both blocks' adds. With 8 taus the 48 rows are three blocks of
    2 whole samples, whose ∂h each stores. `programs` a backward kernel: one loops over every block; two or eight
    (the second kernel's 4 chunks of units × 2) share them, one of them stepping past the last block, and their
    partial sums are added. Every layer's gradient is a sum over blocks and programs either way."""
    from trainer.execution.kernels import iqn

    monkeypatch.setattr(iqn, "ROWS_PER_PROGRAM", 16)
    monkeypatch.setattr(iqn, "_backward_rows", lambda bf16: 16)
    monkeypatch.setattr(iqn, "BACKWARD_PROGRAMS", programs)
    p, d, (h, tau, action, _, _) = _inputs(CORE, seed=40, actions=5)
    tau = torch.rand(6, taus, generator=torch.Generator().manual_seed(41)).to(DEVICE)
    if precision == "bf16":
        p, h = {name: view.bfloat16() for name, view in p.items()}, h.bfloat16()
    z, grad_h, grads = _online_pass(quantiles_at_fused, p, h, tau, action, d)
    want_z, want_h, want = _online_pass(_written, p, h, tau, action, d)
    # bf16: on the CPU bit for bit where each sample's ∂h is one block's sum; split, the sums run in another order
    tolerance = 1e-5 if precision == "fp32" else (0.0 if taus == 8 and DEVICE == "cpu" else 2e-2)
    torch.testing.assert_close(z, want_z, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(grad_h, want_h, rtol=tolerance, atol=tolerance)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want[name], rtol=tolerance, atol=tolerance, msg=name)


HOPPER_SHARED_MEMORY = 227 * 1024
"""The most shared memory an H100's or H200's program may take."""


def shared_memory_on_hopper(precision: str) -> dict[str, int]:
    """Each kernel built for sm_90 by Triton's compiler and ptxas (in Triton's wheel) at `core`'s tiles, as the plans
    launch them (`_launch_options`), without a GPU: its shared memory in bytes. In a process where Triton compiles
    (not the interpreter, which `tests/conftest.py` turns on without a GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trainer.execution.kernels import iqn

    bf16 = precision == "bf16"
    weights = "*bf16" if bf16 else "*fp32"
    flags = {"BRANCHES": 3, "BF16": bf16, "DOT_BF16": bf16, "ROUND": 1 if bf16 else 0, "PRECISION": "tf32"}
    tiles = {"BLOCK_E": 64, "BLOCK_H": 64, "BLOCK_I": 128, "BLOCK_O": 16}
    float32 = {"tau_ptr", "reward_ptr", "done_ptr", "out_ptr", "grad_ptr", "partial_ptr", "gamma"}
    options = {"num_warps": iqn.WARPS_PER_PROGRAM, "num_stages": iqn.STAGES_PER_PROGRAM}
    hopper = GPUTarget("cuda", 90, 32)
    shared, rows, backward_rows = {}, iqn.ROWS_PER_PROGRAM, iqn._backward_rows(bf16)
    for name, kernel, constants in [
        ("target", iqn._quantiles_kernel, {"TARGET": True, "BLOCK_M": rows}),
        ("online", iqn._quantiles_kernel, {"TARGET": False, "BLOCK_M": rows}),
        ("backward-rows", iqn._backward_rows_kernel, {"BLOCK_M": backward_rows}),
        ("backward-units", iqn._backward_units_kernel, {"BLOCK_M": backward_rows, "WHOLE_SAMPLES": 32}),
        ("backward-split", iqn._backward_units_kernel, {"BLOCK_M": backward_rows, "WHOLE_SAMPLES": 0}),
    ]:
        while not isinstance(kernel, triton.runtime.jit.JITFunction):
            kernel = kernel.fn  # under its heuristics
        constants = {k: v for k, v in {**flags, **tiles, **constants}.items() if k in kernel.arg_names}
        signature = {}
        for arg in kernel.arg_names:
            if arg in constants:
                signature[arg] = "constexpr"
            elif arg == "action_ptr":
                signature[arg] = "*i64"
            elif arg == "grad_h_ptr" and not constants["WHOLE_SAMPLES"]:
                signature[arg] = "*fp32"  # each row's share added: float32 sums
            elif arg in float32:
                signature[arg] = "*fp32" if arg.endswith("_ptr") else "fp32"
            else:
                signature[arg] = weights if arg.endswith("_ptr") else "i32"
        compiled = triton.compile(ASTSource(kernel, signature, constants), target=hopper, options=options)
        shared[name] = compiled.metadata.shared
    return shared


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_kernels_compile_for_hopper_within_its_shared_memory(precision: str) -> None:
    """What the interpreter lets by (a construct the code generator refuses, tiles past the shared memory: three
    pipelining stages asked 240 KB of the float32 forward) fails here, not on the device."""
    shared = compiled_without_the_interpreter(__name__, "shared_memory_on_hopper", precision)
    assert shared.keys() == {"target", "online", "backward-rows", "backward-units", "backward-split"}
    assert all(0 < size <= HOPPER_SHARED_MEMORY for size in shared.values()), shared


# ---- a pack's runs: the ops under vmap (one launch for every run) ----


def _runs(precision: str, count: int = 3) -> tuple[list[dict], ModelDims, list[tuple]]:
    """`count` runs' heads and inputs, each its own (seeds 50, 51, ...), in `precision`'s dtype."""
    heads, inputs = [], []
    for run in range(count):
        p, d, (h, tau, action, reward, done) = _inputs(CORE, seed=50 + run, actions=5)
        if precision == "bf16":
            p, h = {name: view.bfloat16() for name, view in p.items()}, h.bfloat16()
        heads.append(p)
        inputs.append((h, tau, action, reward, done))
    return heads, d, inputs


def _stacked(heads: list[dict], inputs: list[tuple]) -> tuple[dict, list[torch.Tensor]]:
    stacked_heads = {name: torch.stack([p[name] for p in heads]) for name in heads[0]}
    return stacked_heads, [torch.stack(t) for t in zip(*inputs, strict=True)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_under_vmap_the_target_kernel_is_each_runs_own(precision: str) -> None:
    """A pack's runs (`trainer.execution.pack` vmaps the step): every run's target, bit for bit, in one launch."""
    heads, d, inputs = _runs(precision)
    p, (h, tau, a_star, reward, done) = _stacked(heads, inputs)

    def target(p: dict, h: torch.Tensor, tau: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == "bf16"):
            return next_quantile_targets_fused(p, h, tau, *rest, GAMMA, d)

    packed = torch.func.vmap(target)(p, h, tau, a_star, reward, done)
    for run, (head, (h_i, tau_i, a_i, r_i, done_i)) in enumerate(zip(heads, inputs, strict=True)):
        assert torch.equal(packed[run], target(head, h_i, tau_i, a_i, r_i, done_i)), run


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_under_vmap_the_online_kernels_give_each_runs_own_gradients(precision: str) -> None:
    """vmap over torch.func.grad, as a pack takes each run's step: each run's ∂h and layers' gradients, bit for bit
    on the CPU; on a GPU torch's sum of the programs' partial sums may take another order for three runs than for
    one, so within float32's rounding of the sums (bf16: one bf16 step)."""
    heads, d, inputs = _runs(precision)
    p, (h, tau, action, _, _) = _stacked(heads, inputs)
    g = torch.randn(3, *tau.shape[1:], d.branches, generator=torch.Generator().manual_seed(60)).to(DEVICE)

    def loss(p: dict, h: torch.Tensor, tau: torch.Tensor, action: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == "bf16"):
            return (g * quantiles_at_fused(p, h, tau, action, d)).sum()

    gradients = torch.func.grad(loss, argnums=(0, 1))
    packed_layers, packed_h = torch.func.vmap(gradients)(p, h, tau, action, g)
    for run, (head, (h_i, tau_i, action_i, _, _)) in enumerate(zip(heads, inputs, strict=True)):
        layers, grad_h = gradients(head, h_i, tau_i, action_i, g[run])
        assert_same_sums(packed_h[run], grad_h, precision, f"run {run} ∂h")
        for name, grad in layers.items():
            assert_same_sums(packed_layers[name][run], grad, precision, f"run {run} ∂{name}")


def assert_same_sums(actual: torch.Tensor, expected: torch.Tensor, precision: str, what: str) -> None:
    """Equal on the CPU, where every sum is made in one order; on a GPU equal to the rounding of sums added in
    another order."""
    if DEVICE == "cpu":
        assert torch.equal(actual, expected), what
    else:
        tolerance = 1e-5 if precision == "fp32" else 2**-7
        scale = expected.abs().max().item()
        torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * scale, msg=what)
