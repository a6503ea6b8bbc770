"""The fused plan's compiled step leaves no tensor op outside Inductor's graphs (CPU: Dynamo and Inductor)."""

from __future__ import annotations

import pytest
import torch

from scripts.kernel_count import NoStreams, eager_ops
from tests.factories import random_batch, tiny_config, tiny_state
from trainer.algo.step import Draws, Hyper, StepFlags
from trainer.execution.plans.fused import _EagerSections, compile_step

VIEWS = frozenset(
    f"aten::{name}"
    for name in (
        "view",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "expand",
        "t",
        "transpose",
        "permute",
        "reshape",
        "alias",
        "detach",
        "unbind",
        "split",
        "chunk",
        "as_strided",
    )
)


@pytest.mark.slow  # a cold CPU compilation of the step: 1.5-3.5 minutes on 2 cores
def test_every_op_after_the_first_stream_section_runs_inside_a_compiled_graph() -> None:
    """Dynamo cannot resume inside a routed section's `with` block, so it runs the rest of train_step as
    Python and compiles only the calls it makes: an op written inline there (round 2's guard) would run
    as an eager kernel, outside every graph and every fusion."""
    config = tiny_config(["model.ensemble_heads=0", "loss.vaccine=false", "loss.causal=false", "run.precision=bf16"])
    hp = Hyper.from_config(config)
    assert hp.iql and hp.attention  # both stream sections are in the step
    state = tiny_state(config)
    batch = random_batch(state, 16, 0)
    draws = Draws.empty(state.dims, 16, torch.device("cpu"), permute=False).fill_(torch.Generator().manual_seed(1))
    timer = _EagerSections(NoStreams())  # type: ignore[arg-type]
    step = compile_step()
    for _ in range(2):  # compile, then run what was compiled
        assert bool(step(state, batch, draws, hp, StepFlags(), timer).ok)
    outside, regions = eager_ops(lambda: step(state, batch, draws, hp, StepFlags(), timer))
    assert regions >= 4  # the step did run as several compiled graphs (the breaks are there)
    assert {name: n for name, n in outside.items() if name not in VIEWS} == {}
