"""The zerocopy plan: the fused plan that only ever samples inside its graph.

In-graph sampling (PER draws, gathers, HER relabelling, draws, update and priority write-back, K =
`run.steps_per_replay` updates per replay) began here and now runs in every graph plan
(`trainer/execution/plans/graph.py`). What this plan keeps of its own is strictness: it refuses a HER goal
reward that calls the host (the other plans then sample outside the graph) and takes no fed batch
(`update`), so its figures are always those of sampling inside the graph.
"""

from __future__ import annotations

from trainer.algo.batch import Batch
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.step import Draws, StepOutput
from trainer.execution.plans.fused import FusedPlan


class ZeroCopyPlan(FusedPlan):
    name = "zerocopy"

    def can_sample_in_graph(self, replay: ReplayBuffer) -> bool:
        """Always: a HER goal reward that calls the host is refused, not sampled outside the graph."""
        her = replay.her
        if her is not None and not her.goal.capturable:
            raise ValueError("plan 'zerocopy' needs a capturable HER goal reward (this env's calls the host)")
        return True

    def update(self, batch: Batch, draws: Draws, step: int) -> StepOutput:
        """Not offered: this plan's graphs sample their own batches; compare it through `run`."""
        raise TypeError("plan 'zerocopy' samples inside its graph and takes no batch; compare it through run()")
