"""The execution plans: the one registry of their names, what each does and the class that runs it.

A plan decides only how `train_step` runs (the maths is the same); `tests/trainer/execution/plans/
test_equivalence.py` compares each with eager. The config's validation (`contracts.config`), the
trainer's `make_plan`, the bench's methods, the CLI's help and the metrics' help all read this table.
Classes are named by import path, so this module stays torch-free for the controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PlanName = Literal["eager", "compile", "graph", "dual", "fused", "zerocopy"]


@dataclass(frozen=True)
class PlanInfo:
    description: str
    implementation: str  # "module:Class", imported only when the plan is built
    needs_cuda: bool  # elsewhere it falls back to eager, with a warning naming why


PLANS: dict[PlanName, PlanInfo] = {
    "eager": PlanInfo(
        "train_step as plain PyTorch, one kernel launch at a time: the reference every plan is compared with.",
        "trainer.execution.plans.eager:EagerPlan",
        needs_cuda=False,
    ),
    "compile": PlanInfo(
        "The eager plan with train_step under torch.compile (reduce-overhead): the compiler's own baseline.",
        "trainer.execution.plans.compiled:CompiledEagerPlan",
        needs_cuda=False,
    ),
    "graph": PlanInfo(
        "The whole update, sampling included, captured as one CUDA graph per periodic variant.",
        "trainer.execution.plans.graph:GraphPlan",
        needs_cuda=True,
    ),
    "dual": PlanInfo(
        "The graph plan with the step's independent groups on side CUDA streams inside the graph.",
        "trainer.execution.plans.dual:DualStreamPlan",
        needs_cuda=True,
    ),
    "fused": PlanInfo(
        "The dual plan with Inductor-fused kernels and TF32.",
        "trainer.execution.plans.fused:FusedPlan",
        needs_cuda=True,
    ),
    "zerocopy": PlanInfo(
        "The fused plan that only ever samples inside its graph and takes no fed batch.",
        "trainer.execution.plans.zerocopy:ZeroCopyPlan",
        needs_cuda=True,
    ),
}


def plan_names(separator: str = ", ") -> str:
    """The plan names joined, for help texts and error messages."""
    return separator.join(PLANS)
