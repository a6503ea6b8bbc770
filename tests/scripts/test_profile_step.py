"""`scripts/profile_step.py`'s variant names: the bench method, and the flags that change how it is built."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from torch._inductor import config as inductor_config

from scripts.profile_step import OVERRIDE_FLAGS, _combo_grouping, flags_scope, split_variant
from trainer.execution.plans.fused import HORIZONTAL_OPTIONS
from trainer.tools.bench import BenchOptions, preset_config


def test_a_variant_splits_into_the_bench_method_and_its_flags() -> None:
    assert split_variant("zerocopy-bf16") == ("zerocopy-bf16", [])
    assert split_variant("zerocopy-bf16+combo") == ("zerocopy-bf16+combo", [])
    assert split_variant("zerocopy-bf16+combo+combo16+tree") == ("zerocopy-bf16+combo", ["combo16", "tree"])


def test_an_unknown_flag_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown variant suffix \['combo32'\].*combo16"):
        split_variant("zerocopy-bf16+combo+combo32")


@pytest.mark.skipif(
    not hasattr(inductor_config, "combo_kernel_max_num_nodes"),
    reason="torch 2.13's setting; torch 2.11's grouping is tested below",
)
def test_combo16_raises_inductors_cap_on_combined_kernels_only_inside_the_variant() -> None:
    default = inductor_config.combo_kernel_max_num_nodes
    assert default != 16
    with flags_scope(["combo16", "tree"]):  # "tree" is a config override: no process setting
        assert inductor_config.combo_kernel_max_num_nodes == 16
    assert inductor_config.combo_kernel_max_num_nodes == default


def test_allcombo_keeps_every_combined_kernel_only_inside_the_variant() -> None:
    assert HORIZONTAL_OPTIONS["benchmark_combo_kernel"] is True
    with flags_scope(["allcombo"]):
        assert HORIZONTAL_OPTIONS == {"combo_kernels": True, "benchmark_combo_kernel": False}
    assert HORIZONTAL_OPTIONS["benchmark_combo_kernel"] is True


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


@pytest.mark.parametrize(
    ("flag", "setting", "inside"),
    [
        ("nosplitred", "split_reductions", False),  # no reduction split into a partial and a final kernel
        ("pdl", "triton.enable_pdl", True),  # Inductor's Triton kernels under programmatic dependent launch
        ("subblocks", "combo_kernel_per_subkernel_blocks", True),  # a combined kernel's parts with their own blocks
    ],
)
def test_a_flag_holds_its_inductor_setting_only_inside_the_variant(flag: str, setting: str, inside: bool) -> None:
    def value() -> object:
        return functools.reduce(getattr, setting.split("."), inductor_config)

    assert value() is (not inside)
    with flags_scope([flag]):
        assert value() is inside
    assert value() is (not inside)


def test_iqnk_builds_the_step_with_the_iqn_target_kernel() -> None:
    assert split_variant("zerocopy-bf16+combo+iqnk") == ("zerocopy-bf16+combo", ["iqnk"])
    config = preset_config("core", BenchOptions(overrides=[OVERRIDE_FLAGS["iqnk"]]))
    assert config.run.iqn_target_kernel == "triton"
    assert preset_config("core", BenchOptions()).run.iqn_target_kernel == "auto"
    inductor = preset_config("core", BenchOptions(overrides=[OVERRIDE_FLAGS["iqni"]]))
    assert inductor.run.iqn_target_kernel == "inductor"
    online = preset_config("core", BenchOptions(overrides=[OVERRIDE_FLAGS["iqno"]]))
    assert online.run.iqn_online_kernel == "triton"
    assert preset_config("core", BenchOptions()).run.iqn_online_kernel == "inductor"
