"""The dual plan: the graph plan with the step's independent groups on side CUDA streams, inside the graph.

Captured as one graph whose DAG forks and joins with events (`StreamRouter`):
- attention (forward, backward, its Adam candidate) forks at the step's start: it reads only the
  batch window and its own parameters, so it overlaps the main network's whole forward/backward;
- IQL forks once the first forward (h_s2, the target trunk) is done and overlaps the backward;
- both join before the guard, which checks their gradients and commits every group at once (the
  target EMA with them: it is computed from the main update's candidate, on the main stream).
IQN stays on the main stream: its gradient is one of the main network's budgeted gradients.
"""

from __future__ import annotations

from trainer.execution.plans.graph import GraphPlan


class DualStreamPlan(GraphPlan):
    name = "dual"
    streams = True
