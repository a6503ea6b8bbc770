"""The `+combo` methods: the compiled plans with Inductor's combined kernels (CPU: options and routing)."""

from __future__ import annotations

import pytest
import torch

from tests.factories import random_batch, tiny_config, tiny_state
from trainer.bench import is_horizontal, split_method
from trainer.plans.fused import HORIZONTAL_OPTIONS, FusedPlan, compile_step
from trainer.step import Draws, Hyper, StepFlags, train_step


def test_combo_is_a_suffix_of_the_compiled_plans_only() -> None:
    assert split_method("zerocopy-bf16+combo") == ("zerocopy", "bf16") and is_horizontal("zerocopy-bf16+combo")
    assert split_method("fused+combo") == ("fused", None) and is_horizontal("fused+combo")
    assert not is_horizontal("zerocopy-bf16")
    for method in ("graph+combo", "compile-bf16+combo", "zerocopy+fast"):
        with pytest.raises(ValueError, match="unknown bench method"):
            split_method(method)
    assert FusedPlan.horizontal is False  # the plans as trained are unchanged


def test_horizontal_compilation_is_accepted_by_inductor_and_computes_the_step() -> None:
    """The options reach torch.compile (an unknown one would raise) and change no maths: the compiled
    step's state is the eager step's within Inductor's float32 reordering (the CPU's C++ kernels are
    never combined; the GPU's Triton ones are checked by the bench's bf16 equivalence test)."""
    assert set(HORIZONTAL_OPTIONS) <= set(torch._inductor.config.get_config_copy())
    with pytest.raises(ValueError, match="a mode or options"):
        compile_step.__wrapped__("max-autotune-no-cudagraphs", True)
    config = tiny_config(["model.ensemble_heads=0", "loss.vaccine=false", "loss.causal=false"])
    hp = Hyper.from_config(config)
    compiled, eager = tiny_state(config), tiny_state(config)
    batch = random_batch(eager, 16, 0)
    draws = Draws.empty(eager.dims, 16, torch.device("cpu"), permute=False).fill_(torch.Generator().manual_seed(1))
    assert bool(compile_step(None, True)(compiled, batch, draws, hp, StepFlags()).ok)
    assert bool(train_step(eager, batch, draws, hp, StepFlags()).ok)
    for name, tensor in eager.tensors().items():
        torch.testing.assert_close(compiled.tensors()[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
