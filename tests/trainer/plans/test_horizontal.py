"""`run.combo_kernels` and the bench's `+combo` methods: the compiled plans with Inductor's combined
kernels (CPU: options and routing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer.bench import BenchOptions, is_horizontal, method_config, preset_config, split_method
from trainer.config import TrainConfig
from trainer.plans.fused import (
    HORIZONTAL_OPTIONS,
    FusedPlan,
    _combo_grouping,
    combo_kernel_cap,
    compile_replay_ops,
    compile_step,
)


def test_combo_is_a_suffix_of_the_compiled_plans_only() -> None:
    assert split_method("zerocopy-bf16+combo") == ("zerocopy", "bf16") and is_horizontal("zerocopy-bf16+combo")
    assert split_method("fused+combo") == ("fused", None) and is_horizontal("fused+combo")
    assert not is_horizontal("zerocopy-bf16")
    for method in ("graph+combo", "compile-bf16+combo", "zerocopy+fast"):
        with pytest.raises(ValueError, match="unknown bench method"):
            split_method(method)


def test_combo_suffix_is_the_run_option() -> None:
    """The bench's `+combo` is what a user sets in a recipe, so the bench times what `trainer train` runs."""
    config = preset_config("core", BenchOptions())
    assert TrainConfig().run.combo_kernels is False  # off unless asked for: ~70 s more compilation
    combo = method_config(config, "zerocopy-bf16+combo").run
    assert (combo.combo_kernels, combo.precision) == (True, "bf16")
    plain = method_config(config, "zerocopy-bf16").run
    assert (plain.combo_kernels, plain.precision) == (False, "bf16")


def test_horizontal_compilation_is_accepted_by_inductor() -> None:
    """The options reach torch.compile, which checks them as it wraps the step (an unknown one raises
    there). The maths under them is not run here: on the CPU Inductor's C++ kernels are never combined,
    so the step would compile to what the compile baseline test (tests/trainer/test_bench.py) already
    checks against eager; the GPU's Triton ones are checked by the bench's bf16 equivalence test."""
    assert set(HORIZONTAL_OPTIONS) <= set(torch._inductor.config.get_config_copy())
    with pytest.raises(ValueError, match="a mode or options"):
        compile_step.__wrapped__("max-autotune-no-cudagraphs", True)
    assert callable(compile_step.__wrapped__(None, True))
    with pytest.raises(RuntimeError, match="Unexpected optimization option"):
        torch.compile(lambda x: x, options={**HORIZONTAL_OPTIONS, "not_an_option": True})


@pytest.mark.parametrize("combo", [False, True])
def test_the_compiled_plans_take_combined_kernels_from_the_run_config(combo: bool) -> None:
    """`run.combo_kernels` picks the step's compiled wrapper (the plan itself needs a GPU to build)."""
    config = TrainConfig()
    config.run.combo_kernels = combo
    plan = SimpleNamespace(compiled=True, compile_mode=None, config=config)
    assert FusedPlan.step_fn.func(plan) is compile_step(None, combo)  # type: ignore[arg-type]
    assert FusedPlan.replay_ops.fget(plan) is compile_replay_ops(combo)  # type: ignore[attr-defined]
    assert compile_replay_ops(combo) is not compile_replay_ops(not combo)


def test_the_combined_kernel_cap_is_inductors_setting_where_torch_has_one() -> None:
    default = torch._inductor.config.combo_kernel_max_num_nodes  # torch 2.13
    with combo_kernel_cap(16):
        assert torch._inductor.config.combo_kernel_max_num_nodes == 16
    assert torch._inductor.config.combo_kernel_max_num_nodes == default


def test_the_combined_kernel_cap_replaces_torch_2_11s_grouping_inside_the_block_only() -> None:
    """torch 2.11 (the GPU machine's) hard-codes 8 nodes per combined kernel: the cap swaps in the same
    grouping, runs of each level of independent nodes, at the cap."""
    from torch._inductor.scheduler import ForeachKernelSchedulerNode

    default = ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels
    scheduler = SimpleNamespace(_topological_sort_nodes=lambda: [list(range(20)), [20, 21]])
    with _combo_grouping(16):
        groups = ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels(scheduler)
    assert groups == [list(range(16)), [16, 17, 18, 19], [20, 21]]
    assert ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels is default
