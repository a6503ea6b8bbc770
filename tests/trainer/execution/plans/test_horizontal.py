"""`run.combo_kernels` and the bench's `+combo` methods: the compiled plans with Inductor's combined
kernels (CPU: options and routing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from contracts.config import TrainConfig
from trainer.execution.plans.fused import HORIZONTAL_OPTIONS, FusedPlan, compile_replay_ops, compile_step
from trainer.tools.bench import BenchOptions, is_horizontal, method_config, preset_config, split_method


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
    so the step would compile to what the compile baseline test (tests/trainer/tools/test_bench.py) already
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
