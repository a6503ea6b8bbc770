"""The step's kernels (`Hyper` fields a fused plan swaps in) inside whole training steps on the CPU, through Triton's
interpreter; on a GPU the plans' equivalence tests run them (`tests/trainer/execution/plans/test_equivalence.py`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.factories import on_the_interpreter, steps_with_kernels, tiny_config, tiny_state
from trainer.execution.kernels.c51 import c51_target
from trainer.execution.kernels.iqn import next_quantile_targets_fused, quantiles_at_fused


@on_the_interpreter
@pytest.mark.parametrize(
    "kernels",
    [{"c51_target": c51_target}, {"iqn_target": next_quantile_targets_fused}, {"iqn_online": quantiles_at_fused}],
    ids=["c51-target", "iqn-target", "iqn-online"],
)
def test_training_steps_with_the_kernel_match_the_reference_steps(kernels: dict[str, Any]) -> None:
    """The step's Hyper field swapped for the kernel (what the fused plans do with run.c51_target_kernel,
    run.iqn_target_kernel or run.iqn_online_kernel triton): three updates land on the reference steps' state."""
    config = tiny_config()
    fused = steps_with_kernels(config, kernels)
    assert not torch.equal(fused.online, tiny_state(config).online)  # the network trained
