"""The `+combo` methods: the compiled plans with Inductor's combined kernels (CPU: options and routing)."""

from __future__ import annotations

import pytest
import torch

from trainer.bench import is_horizontal, split_method
from trainer.plans.fused import HORIZONTAL_OPTIONS, FusedPlan, compile_step


def test_combo_is_a_suffix_of_the_compiled_plans_only() -> None:
    assert split_method("zerocopy-bf16+combo") == ("zerocopy", "bf16") and is_horizontal("zerocopy-bf16+combo")
    assert split_method("fused+combo") == ("fused", None) and is_horizontal("fused+combo")
    assert not is_horizontal("zerocopy-bf16")
    for method in ("graph+combo", "compile-bf16+combo", "zerocopy+fast"):
        with pytest.raises(ValueError, match="unknown bench method"):
            split_method(method)
    assert FusedPlan.horizontal is False  # the plans as trained are unchanged


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
