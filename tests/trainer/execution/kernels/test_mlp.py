"""The target pass's networks in one kernel (`trainer.execution.kernels.mlp`) against `trunk` then `c51_logits`, the
products, biases, relus and dueling combine it replaces. On the CPU through Triton's interpreter; on the GPU compiled by
Inductor (the last test; 50 fused steps with it against eager: `tests/trainer/execution/plans/test_equivalence.py`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from contracts.config import TARGET_MLP_KERNEL_MAX_ACTIONS, TARGET_MLP_KERNEL_MAX_WIDTH, ConfigError, build_config
from tests.factories import (
    compiled_without_the_interpreter,
    needs_gpu,
    on_the_interpreter,
    steps_with_kernels,
    tiny_config,
    tiny_state,
)
from trainer.algo.model import ModelDims, c51_logits, trunk
from trainer.algo.step import Hyper, mixed_precision, network_views
from trainer.execution.kernels.mlp import supports, target_mlp, target_networks
from trainer.execution.plans._capture import matmul_precision
from trainer.execution.plans.fused import FusedPlan
from trainer.execution.plans.graph import GraphPlan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = {
    "odd-widths": ([], 7, 3, 5),  # tiny_config: H 32, h 16, N 11, two ensemble heads (rows the kernel skips)
    "chunked": (["model.atoms=51", "model.hidden=48", "model.head_hidden=20"], 40, 2, 5),  # 2 × 32 F, H; 4 × 16 N
    "two-actions": (["model.atoms=51"], 7, 1, 2),  # the advantage tile: 2 actions × 64 atoms
}
BATCH = 19
"""Samples: 2B = 38 states a network, a block of 32 and one of 6."""


def _inputs(
    overrides: list[str], features: int, branches: int, actions: int, precision: str
) -> tuple[dict, torch.Tensor, Hyper]:
    """The online and target networks' stacked views in the step's dtype (`network_views` of [2, P]) and their states
    [2, 2B, F] (one [2B, F] tensor expanded, as `compute_targets` has them); the step's Hyper."""
    config = tiny_config([f"run.precision={precision}", *overrides])
    state = tiny_state(config, obs_dim=features, branches=branches, actions=actions)
    generator = torch.Generator().manual_seed(features + branches)
    target = state.target + 0.05 * torch.randn(state.target.shape, generator=generator)
    hp = Hyper.from_config(config)
    both = network_views(state.main, torch.stack([state.online, target]).to(DEVICE), hp)
    states = torch.randn(2 * BATCH, features, generator=generator).to(DEVICE).expand(2, -1, -1)
    return both, states, hp


def _written(both: dict, states: torch.Tensor, d: ModelDims, hp: Hyper) -> tuple[torch.Tensor, torch.Tensor]:
    """`compute_targets`' two calls, under its autocast."""
    with mixed_precision(hp, states.device):
        h = trunk(both, states)
        return h, c51_logits(both, h, d)


def _dims(overrides: list[str], features: int, branches: int, actions: int) -> ModelDims:
    return ModelDims.build(tiny_config(overrides).model, features, branches, actions)


@on_the_interpreter
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("overrides", "features", "branches", "actions"), SHAPES.values(), ids=SHAPES.keys())
def test_the_kernel_is_the_trunk_and_the_dueling_heads(
    overrides: list[str], features: int, branches: int, actions: int, precision: str
) -> None:
    """float32: the products' sums in another order, within 1e-6 (measured: 6e-8, one ulp of the logits). bf16 (the
    weights cast once, the states by the kernel, each layer's product rounded, its bias added and rounded again, as
    autocast's products and the adds after them round): the written form under CPU autocast, bit for bit."""
    both, states, hp = _inputs(overrides, features, branches, actions, precision)
    d = _dims(overrides, features, branches, actions)
    h, logits = target_networks(both, states, d)
    want_h, want_logits = _written(both, states, d, hp)
    assert h.shape == want_h.shape == (2, 2 * BATCH, d.hidden) and h.dtype == want_h.dtype
    assert logits.shape == (2, 2 * BATCH, branches, actions, d.atoms) and logits.dtype == torch.float32
    tolerance = 1e-6 if precision == "fp32" else 0.0
    torch.testing.assert_close(h, want_h, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(logits, want_logits, rtol=tolerance, atol=tolerance)
    if precision == "bf16":
        fp32_both = {name: view.float() for name, view in both.items()}
        fp32 = c51_logits(fp32_both, trunk(fp32_both, states), d)
        assert not torch.allclose(logits, fp32, rtol=1e-4, atol=1e-4)  # the rounding happened: not float32's result
    assert not torch.allclose(logits[0], logits[1])  # each network its own weights


@on_the_interpreter
def test_a_non_finite_state_poisons_only_its_own_rows() -> None:
    shape = SHAPES["odd-widths"]
    both, states, _ = _inputs(*shape, "fp32")
    states = states.clone()
    states[1, 5, 3] = float("nan")
    h, logits = target_networks(both, states, _dims(*shape))
    assert torch.isnan(logits[1, 5]).all() and torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[1, [*range(5), *range(6, 2 * BATCH)]]).all() and torch.isfinite(h[0]).all()


@on_the_interpreter
def test_training_steps_with_the_kernel_match_the_reference_steps() -> None:
    """The step's Hyper field swapped for the kernel (what the fused plans do with run.target_mlp_kernel triton):
    three updates land on the reference steps' state."""
    config = tiny_config()
    trained = steps_with_kernels(config, {"target_networks": target_networks})
    assert not torch.equal(trained.online, tiny_state(config).online)


def test_what_the_kernel_cannot_run_is_refused_here_and_by_the_config() -> None:
    widest = _dims([f"model.hidden={TARGET_MLP_KERNEL_MAX_WIDTH}"], 64, 3, TARGET_MLP_KERNEL_MAX_ACTIONS)
    assert supports(widest) and supports(dataclasses.replace(widest, obs_dim=4096, atoms=1001))  # taken in chunks
    assert not supports(dataclasses.replace(widest, actions=TARGET_MLP_KERNEL_MAX_ACTIONS + 1))
    assert not supports(dataclasses.replace(widest, head_hidden=TARGET_MLP_KERNEL_MAX_WIDTH + 1))
    shape = SHAPES["odd-widths"]
    both, states, _ = _inputs(*shape, "fp32")
    d = _dims(*shape)
    with pytest.raises(ValueError, match=r"the actions at most 16, got 32, 16 and 17"):
        target_mlp(states, [both["trunk1_w"]] * 10, d.head_hidden, 1, 17)  # refused before any read
    with pytest.raises(ValueError, match="trunk1_w needs unit stride"):
        transposed = both["trunk1_w"].transpose(1, 2).contiguous().transpose(1, 2)
        target_networks({**both, "trunk1_w": transposed}, states, d)
    with pytest.raises(ConfigError, match=r"run.target_mlp_kernel 'triton' takes widths of at most 256; model.hidden"):
        build_config({"model": {"hidden": 512}, "run": {"target_mlp_kernel": "triton"}})
    with pytest.raises(ConfigError, match=r"256; model.head_hidden is 300 \(use 'inductor'\)"):
        build_config({"model": {"head_hidden": 300}, "run": {"target_mlp_kernel": "triton"}})
    assert build_config({"model": {"hidden": 512}}).run.target_mlp_kernel == "inductor"


def test_the_fused_plans_run_the_kernel_only_when_asked_and_the_other_plans_and_packs_never() -> None:
    """Opt-in (measured slower, round 24). A pack's Hyper is its config's (`PackPlan`: `Hyper.from_config`), without
    the kernel, which has no vmap rule; the profiler's `+mlpt` variant asks for it."""
    from scripts.profile_step import OVERRIDE_FLAGS, split_variant
    from tests.trainer.execution.test_pack import run_config, solo_run
    from trainer.execution.pack import Pack, PackPlan

    fused, graph = object.__new__(FusedPlan), object.__new__(GraphPlan)  # hyper() reads the config and the dims
    fused.state = graph.state = tiny_state(tiny_config(), branches=3, actions=5)
    asked = tiny_config(["run.target_mlp_kernel=triton"])
    assert tiny_config().run.target_mlp_kernel == "inductor"
    assert fused.hyper(asked).target_networks is target_networks
    assert fused.hyper(tiny_config(["run.precision=bf16"])).target_networks is None
    assert graph.hyper(asked).target_networks is None
    configs = [run_config(i, full=False).model_copy(update={"run": asked.run}) for i in range(2)]
    assert PackPlan(Pack(configs, solo_run), compiled=True).hp.target_networks is None
    assert split_variant("zerocopy-bf16+combo+mlpt") == ("zerocopy-bf16+combo", ["mlpt"])
    assert OVERRIDE_FLAGS["mlpt"] == "run.target_mlp_kernel=triton"


HOPPER_SHARED_MEMORY = 227 * 1024
"""The most shared memory an H100's or H200's program may take."""


def shared_memory_on_hopper() -> dict[str, int]:
    """The kernel built for sm_90 by Triton's compiler and ptxas (in Triton's wheel) at `core`'s widths (F 64, H 256,
    h 128, N 51, 3 × 5 actions) as the fused plans launch it, in float32 (TF32) and bf16, without a GPU: its shared
    memory in bytes. In a process where Triton compiles (not the interpreter, which `tests/conftest.py` turns on
    without a GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trainer.execution.kernels import mlp

    kernel = mlp._target_mlp_kernel
    options = {"num_warps": mlp.WARPS_PER_PROGRAM, "num_stages": mlp.STAGES_PER_PROGRAM}
    shared = {}
    for precision in ("fp32", "bf16"):
        bf16 = precision == "bf16"
        constants = {**mlp.launch_constants(64, 256, 128, 51, 3, 5, bf16, interpreter=False), "PRECISION": "tf32"}
        signature = {}
        for arg in kernel.arg_names:
            if arg in constants:
                signature[arg] = "constexpr"
            elif arg in ("x_ptr", "out_ptr"):
                signature[arg] = "*fp32"
            else:
                signature[arg] = ("*bf16" if bf16 else "*fp32") if arg.endswith("_ptr") else "i32"
        compiled = triton.compile(
            ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32), options=options
        )
        shared[precision] = compiled.metadata.shared
    return shared


def test_the_kernel_compiles_for_hopper_within_its_shared_memory() -> None:
    """What the interpreter lets by (a construct the code generator refuses, tiles past the shared memory: with the
    atoms' loop pipelined too, 248 KB in float32) fails here, not on the device."""
    shared = compiled_without_the_interpreter(__name__, "shared_memory_on_hopper")
    assert shared.keys() == {"fp32", "bf16"}
    assert all(0 < size <= HOPPER_SHARED_MEMORY for size in shared.values()), shared


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_on_the_gpu_the_target_pass_is_the_kernel(precision: str) -> None:
    """At `core`'s widths (F 64, H 256, h 128, N 51, 3 × 5 actions): Dynamo keeps the op whole, and its outputs are
    the written form's (cuBLAS and the kernel sum in other orders; float32 in TF32 both, bf16 one bf16 step)."""
    shape = (["model.ensemble_heads=0", "model.hidden=256", "model.head_hidden=128", "model.atoms=51"], 64, 3, 5)
    both, states, hp = _inputs(*shape, precision)
    d = _dims(*shape)
    torch._dynamo.reset()

    def kernel(both: dict, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with mixed_precision(hp, states.device):
            return target_networks(both, states, d)

    compiled = torch.compile(kernel, fullgraph=True, dynamic=False)
    with matmul_precision(True):
        (h, logits), sources = run_and_get_code(compiled, both, states)
        want_h, want_logits = _written(both, states, d, hp)
    assert any("foxhunt.target_mlp" in source for source in sources)
    tolerance = 1e-2 if precision == "fp32" else 2e-2
    torch.testing.assert_close(h, want_h, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(logits, want_logits, rtol=tolerance, atol=tolerance)
